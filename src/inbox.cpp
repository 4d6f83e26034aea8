// The SQLite store. All of the inbox's SQL for the per-message path and the dead letters
// lives in this file.
#include "mqtt_inbox/inbox.h"

#include <sqlite3.h>

#include <SQLiteCpp/SQLiteCpp.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <exception>
#include <mutex>
#include <vector>

#include "log.h"
#include "mqtt_inbox/clock.h"
#include "inbox_impl.h"
#include "schema.h"
#include "sqlite_util.h"
#include "text.h"

namespace mqtt_inbox {

namespace {

// 64-bit FNV-1a: a cheap fingerprint of the payload for debugging (not security).
int64_t payload_hash(const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return static_cast<int64_t>(h);
}

constexpr const char* kLookupSql =
    "SELECT EXISTS(SELECT 1 FROM inbox_processed"
    "              WHERE consumer_name = ?1 AND message_id = ?2),"
    "       (SELECT id FROM inbox_dead_letters"
    "        WHERE consumer_name = ?1 AND message_id = ?2 AND status = 'dead'"
    "        ORDER BY id DESC LIMIT 1),"
    "       a.attempts, a.state, a.last_error, a.first_attempt_at"
    "  FROM (SELECT 1) LEFT JOIN inbox_attempts a"
    "    ON a.consumer_name = ?1 AND a.message_id = ?2";

constexpr const char* kBeginAttemptSql =
    "INSERT INTO inbox_attempts (consumer_name, message_id, attempts, first_attempt_at,"
    "                            last_attempt_at, state)"
    " VALUES (?1, ?2, 1, ?3, ?3, 'running')"
    " ON CONFLICT (consumer_name, message_id) DO UPDATE"
    "   SET attempts = attempts + 1, last_attempt_at = excluded.last_attempt_at,"
    "       state = 'running'"
    " RETURNING attempts";

constexpr const char* kAttemptFailedSql =
    "UPDATE inbox_attempts SET state = 'failed', last_error = ?3"
    " WHERE consumer_name = ?1 AND message_id = ?2";

constexpr const char* kClaimSql =
    "INSERT INTO inbox_processed (consumer_name, message_id, received_at, topic,"
    "                             message_type, correlation_id, payload_hash)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
    " ON CONFLICT (consumer_name, message_id) DO NOTHING";

constexpr const char* kDeleteAttemptsSql =
    "DELETE FROM inbox_attempts WHERE consumer_name = ?1 AND message_id = ?2";

constexpr const char* kMarkReplayedSql =
    "UPDATE inbox_dead_letters SET status = 'replayed', replayed_at = ?2 WHERE id = ?1";

constexpr const char* kDeadLetterColumns =
    "id, consumer_name, message_id, topic, payload, payload_size, properties, qos, reason,"
    " reason_text, attempts, first_attempt_at, last_attempt_at, dead_lettered_at,"
    " redeliveries, status, replayed_at";

DeadLetter read_dead_letter(SQLite::Statement& q) {
  DeadLetter d;
  d.id = q.getColumn(0).getInt64();
  d.consumer_name = q.getColumn(1).getString();
  if (!q.getColumn(2).isNull()) d.message_id = q.getColumn(2).getString();
  d.topic = q.getColumn(3).getString();
  d.payload = q.getColumn(4).getString();
  d.payload_size = q.getColumn(5).getInt64();
  d.properties_json = q.getColumn(6).isNull() ? "{}" : q.getColumn(6).getString();
  d.qos = q.getColumn(7).getInt();
  if (!parse_dead_letter_reason(q.getColumn(8).getString(), &d.reason))
    d.reason = DeadLetterReason::kHandlerFailed;
  d.reason_text = q.getColumn(9).getString();
  d.attempts = q.getColumn(10).getInt();
  d.first_attempt_at_ms = q.getColumn(11).getInt64();
  d.last_attempt_at_ms = q.getColumn(12).getInt64();
  d.dead_lettered_at_ms = q.getColumn(13).getInt64();
  d.redeliveries = q.getColumn(14).getInt();
  d.replayed = q.getColumn(15).getString() == "replayed";
  if (!q.getColumn(16).isNull()) d.replayed_at_ms = q.getColumn(16).getInt64();
  return d;
}

// WHERE clause and bindings for a DeadLetterFilter.
struct FilterSql {
  std::string where;
  std::vector<std::function<void(SQLite::Statement&, int)>> binds;
};

FilterSql filter_sql(const DeadLetterFilter& f) {
  FilterSql s;
  std::vector<std::string> terms;
  if (f.consumer_name) {
    terms.push_back("consumer_name = ?");
    std::string v = *f.consumer_name;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.reason) {
    terms.push_back("reason = ?");
    std::string v = to_string(*f.reason);
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.message_id) {
    terms.push_back("message_id = ?");
    std::string v = *f.message_id;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.since_ms) {
    terms.push_back("dead_lettered_at >= ?");
    int64_t v = *f.since_ms;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (f.before_ms) {
    terms.push_back("dead_lettered_at < ?");
    int64_t v = *f.before_ms;
    s.binds.push_back([v](SQLite::Statement& q, int i) { q.bind(i, v); });
  }
  if (!f.include_replayed) terms.push_back("status = 'dead'");
  for (size_t i = 0; i < terms.size(); ++i) s.where += (i ? " AND " : " WHERE ") + terms[i];
  return s;
}

}  // namespace

Inbox::Inbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Inbox::~Inbox() {
  // Best effort: a clock that restarts from an older value only keeps rows longer. So
  // it waits for another process's lock only briefly: an application that exits
  // because the store is locked (a start-up deadline) must not hang here.
  if (impl_->db) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    sqlite3_busy_timeout(impl_->db->getHandle(), std::min(impl_->options.busy_timeout_ms, 200));
  }
  (void)persist_retention_clock();
  const int fd = impl_->lock_fd;
  impl_.reset();  // close the database before giving up the lock
  if (fd >= 0) ::close(fd);
}

int64_t Inbox::retention_clock_ms() const { return impl_->retention_clock(); }

Status Inbox::persist_retention_clock() {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "INSERT INTO inbox_meta (key, value) VALUES ('retention_clock_ms', ?1)"
                        " ON CONFLICT (key) DO UPDATE SET value = CAST(max(CAST(value AS INTEGER),"
                        " CAST(excluded.value AS INTEGER)) AS TEXT)");
    q.bind(1, std::to_string(impl_->retention_clock()));
    q.exec();
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "persisting the retention clock"));
  }
  return Status::Ok();
}

namespace {
int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}
}  // namespace

InboxStats Inbox::stats() const {
  const Impl& m = *impl_;
  InboxStats s;
  s.processed = m.processed.load();
  s.duplicates = m.duplicates.load();
  s.dead_lettered = m.dead_lettered.load();
  s.retries = m.retries.load();
  s.store_errors = m.store_errors.load();
  s.pruned = m.pruned.load();
  s.dead_letters_pruned = m.dead_letters_pruned.load();
  const int64_t seen = s.processed + s.duplicates;
  s.duplicate_ratio = seen ? static_cast<double>(s.duplicates) / static_cast<double>(seen) : 0.0;

  const uint64_t n = std::min<uint64_t>(m.latency_next.load(), Impl::kLatencySamples);
  std::vector<int32_t> lat;
  lat.reserve(n);
  for (uint64_t i = 0; i < n; ++i) lat.push_back(m.latency_us[i].load(std::memory_order_relaxed));
  if (!lat.empty()) {
    std::sort(lat.begin(), lat.end());
    s.commit_p50_us = lat[lat.size() / 2];
    s.commit_p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  s.commit_max_us = m.commit_max_us.load();
  s.db_bytes = file_size(m.path);
  s.wal_bytes = file_size(m.path + "-wal");
  s.schema_version = kSchemaVersion;
  s.retention_clock_ms = m.retention_clock();
  {
    std::lock_guard<std::mutex> lock(m.stats_mu);
    s.consumers = m.consumer_rows;
    s.rows_measured_at = m.rows_measured_at;
  }
  return s;
}

Status Inbox::refresh_row_stats() { return impl_->measure_rows(nullptr); }

Status Inbox::Impl::measure_rows(SQLite::Database* reader) {
  if (fatal.load()) return fatal_status();
  std::map<std::string, ConsumerRows> rows;
  auto run = [&](SQLite::Database& conn) {
    SQLite::Statement q(conn,
                        "SELECT consumer_name, count(*), min(received_at), max(received_at)"
                        " FROM inbox_processed GROUP BY consumer_name");
    while (q.executeStep()) {
      ConsumerRows r;
      r.rows = q.getColumn(1).getInt64();
      r.oldest_received_at = q.getColumn(2).getInt64();
      r.newest_received_at = q.getColumn(3).getInt64();
      rows[q.getColumn(0).getString()] = r;
    }
  };
  try {
    if (reader) {
      run(*reader);
    } else {
      std::lock_guard<std::mutex> lock(mu);
      run(*db);
    }
  } catch (const SQLite::Exception& e) {
    return store_error(detail::to_status(e, "measuring rows"), /*holding_connection=*/reader == nullptr);
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  consumer_rows = std::move(rows);
  rows_measured_at = std::max<int64_t>(1, retention_clock());  // 0 means "never measured"
  return Status::Ok();
}

const std::string& Inbox::path() const { return impl_->path; }
const InboxOptions& Inbox::options() const { return impl_->options; }

// The cached statements of the per-message path, on a connection just opened. Called by
// Inbox::Impl::open_connection (inbox_open.cpp).
void Inbox::Impl::prepare_statements() {
  SQLite::Database& c = *db;
  lookup = std::make_unique<SQLite::Statement>(c, kLookupSql);
  begin_attempt = std::make_unique<SQLite::Statement>(c, kBeginAttemptSql);
  attempt_failed = std::make_unique<SQLite::Statement>(c, kAttemptFailedSql);
  claim = std::make_unique<SQLite::Statement>(c, kClaimSql);
  delete_attempts = std::make_unique<SQLite::Statement>(c, kDeleteAttemptsSql);
  mark_replayed = std::make_unique<SQLite::Statement>(c, kMarkReplayedSql);
}

Status Inbox::lookup(const std::string& consumer, const std::string& message_id,
                     MessageState* out) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  SQLite::Statement& q = *impl_->lookup;
  detail::StatementReset reset(q);
  try {
    q.bind(1, consumer);
    q.bind(2, message_id);
    *out = MessageState{};
    if (q.executeStep()) {
      out->processed = q.getColumn(0).getInt() != 0;
      if (out->processed) ++impl_->duplicates;  // the caller skips it as a duplicate
      if (!q.getColumn(1).isNull()) out->dead_letter_id = q.getColumn(1).getInt64();
      if (!q.getColumn(2).isNull()) {
        out->attempts = q.getColumn(2).getInt();
        out->last_attempt_running = q.getColumn(3).getString() == "running";
        out->last_error = q.getColumn(4).isNull() ? "" : q.getColumn(4).getString();
        out->first_attempt_at_ms = q.getColumn(5).getInt64();
      }
    }
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "looking up message"));
  }
  return Status::Ok();
}

Status Inbox::begin_attempt(const std::string& consumer, const std::string& message_id,
                            int* attempt) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    Impl::RelaxedSync relaxed(*impl_);
    SQLite::Statement& q = *impl_->begin_attempt;
    detail::StatementReset reset(q);
    q.bind(1, consumer);
    q.bind(2, message_id);
    q.bind(3, impl_->clock->wall_ms());
    if (!q.executeStep()) return Status::Internal("attempt upsert returned no row");
    *attempt = q.getColumn(0).getInt();
    // Step to SQLITE_DONE so the autocommit transaction commits before we return.
    while (q.executeStep()) {
    }
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "recording attempt"));
  }
  return Status::Ok();
}

Status Inbox::record_attempt_failure(const std::string& consumer,
                                     const std::string& message_id,
                                     const std::string& error) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    Impl::RelaxedSync relaxed(*impl_);
    SQLite::Statement& q = *impl_->attempt_failed;
    detail::StatementReset reset(q);
    q.bind(1, consumer);
    q.bind(2, message_id);
    q.bind(3, error);
    q.exec();
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "recording attempt failure"));
  }
  ++impl_->retries;
  return Status::Ok();
}

Status Inbox::claim(const std::string& consumer, const Message& message,
                    const std::string& message_id, int attempt, const Handler& handler,
                    std::optional<int64_t> replayed_dead_letter, ClaimResult* result,
                    std::string* handler_error) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  if (impl_->options.before_claim_hook) impl_->options.before_claim_hook(consumer, message_id);
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  SQLite::Database& db = *m.db;
  const auto started = std::chrono::steady_clock::now();
  try {
    db.exec("BEGIN IMMEDIATE");
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "BEGIN IMMEDIATE"));
  }
  // From here on, every path either commits or rolls back before returning.
  try {
    {
      SQLite::Statement& q = *m.claim;
      detail::StatementReset reset(q);
      q.bind(1, consumer);
      q.bind(2, message_id);
      q.bind(3, m.retention_clock());
      if (m.options.record_metadata) {
        q.bind(4, message.topic);
        if (message.content_type) q.bind(5, *message.content_type);
        if (message.correlation_data && detail::is_valid_utf8(*message.correlation_data))
          q.bind(6, *message.correlation_data);
        q.bind(7, payload_hash(message.payload));
      }
      q.exec();
    }
    if (db.getChanges() == 0) {
      // Someone else's claim won (a concurrent delivery). Our begin_attempt may have
      // re-created the attempts row after their commit deleted it; remove it with them.
      SQLite::Statement& q = *m.delete_attempts;
      detail::StatementReset reset(q);
      q.bind(1, consumer);
      q.bind(2, message_id);
      if (q.exec() > 0) {
        db.exec("COMMIT");
      } else {
        detail::rollback_quietly(db);
      }
      *result = ClaimResult::kDuplicate;
      ++m.duplicates;
      return Status::Ok();
    }

    const Delivery delivery{message, message_id, attempt};
    // While the handler runs, BEGIN/COMMIT/ROLLBACK are refused at prepare time: a handler
    // that ended the inbox's transaction would commit its effect apart from the claim. The
    // authorizer is removed before anything else runs (our own COMMIT or ROLLBACK).
    std::exception_ptr handler_failure;
    sqlite3_set_authorizer(
        db.getHandle(),
        [](void*, int action, const char*, const char*, const char*, const char*) {
          return action == SQLITE_TRANSACTION ? SQLITE_DENY : SQLITE_OK;
        },
        nullptr);
    try {
      handler(db, delivery);
    } catch (...) {
      handler_failure = std::current_exception();
    }
    sqlite3_set_authorizer(db.getHandle(), nullptr, nullptr);
    try {
      if (handler_failure) std::rethrow_exception(handler_failure);
    } catch (const SQLite::Exception& e) {
      detail::rollback_quietly(db);
      const Status s = detail::to_status(e, "handler statement");
      if (detail::error_class(e.getErrorCode()) != detail::ErrorClass::kMessage)
        return impl_->store_error(s);  // the store's failure, transient or fatal
      *result = ClaimResult::kHandlerFailed;
      *handler_error = e.what();
      return Status::Ok();
    } catch (const UndecodablePayload& e) {
      detail::rollback_quietly(db);
      *result = ClaimResult::kUndecodable;
      *handler_error = e.what();
      return Status::Ok();
    } catch (const std::exception& e) {
      detail::rollback_quietly(db);
      *result = ClaimResult::kHandlerFailed;
      *handler_error = e.what();
      return Status::Ok();
    } catch (...) {
      detail::rollback_quietly(db);
      *result = ClaimResult::kHandlerFailed;
      *handler_error = "handler threw a non-standard exception";
      return Status::Ok();
    }
    if (sqlite3_get_autocommit(db.getHandle())) {
      // The handler ran COMMIT or ROLLBACK itself: the claim and its effect may be split.
      *result = ClaimResult::kHandlerFailed;
      *handler_error = "handler ended the inbox transaction (COMMIT/ROLLBACK is not allowed)";
      m.log->error("consumer '{}', message '{}': {}", detail::printable(consumer),
                   detail::printable(message_id), *handler_error);
      return Status::Ok();
    }

    {
      SQLite::Statement& q = *m.delete_attempts;
      detail::StatementReset reset(q);
      q.bind(1, consumer);
      q.bind(2, message_id);
      q.exec();
    }
    if (replayed_dead_letter) {
      SQLite::Statement& q = *m.mark_replayed;
      detail::StatementReset reset(q);
      q.bind(1, *replayed_dead_letter);
      q.bind(2, m.clock->wall_ms());
      q.exec();
    }
    db.exec("COMMIT");
  } catch (const SQLite::Exception& e) {
    detail::rollback_quietly(db);
    // A change of this message refused at any point, COMMIT included (a deferred foreign
    // key, a CHECK, the commit hook's veto): a failure of this message, not of the store
    // (sqlite_errors.h), so it counts as a handler attempt instead of being retried forever.
    if (detail::error_class(e.getErrorCode()) == detail::ErrorClass::kMessage) {
      *result = ClaimResult::kHandlerFailed;
      *handler_error = std::string("the store refused this message's transaction: ") + e.what();
      return Status::Ok();
    }
    return impl_->store_error(detail::to_status(e, "claim transaction"));
  } catch (const std::exception& e) {
    detail::rollback_quietly(db);
    return Status::Internal(std::string("claim transaction: ") + e.what());
  }
  *result = ClaimResult::kProcessed;
  ++m.processed;
  m.last_commit_steady_ms = m.clock->steady_ms();
  m.record_latency(std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::steady_clock::now() - started)
                       .count());
  if (m.options.after_commit_hook) m.options.after_commit_hook(consumer, message_id);
  return Status::Ok();
}

Status Inbox::add_dead_letter(const DeadLetter& dl, std::optional<int64_t> replace_id,
                              int64_t* id) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& m = *impl_;
  SQLite::Database& db = *m.db;
  const int64_t now = m.clock->wall_ms();
  bool counted = false;  // a new or replaced dead letter, not a redelivery bump
  try {
    m.write_transaction([&] {
      std::optional<int64_t> existing = replace_id;
      if (!existing && dl.message_id) {
        SQLite::Statement q(db,
                            "SELECT id FROM inbox_dead_letters WHERE consumer_name = ?1"
                            " AND message_id = ?2 AND status = 'dead' ORDER BY id DESC LIMIT 1");
        q.bind(1, dl.consumer_name);
        q.bind(2, *dl.message_id);
        if (q.executeStep()) {
          existing = q.getColumn(0).getInt64();
          SQLite::Statement u(db,
                              "UPDATE inbox_dead_letters SET redeliveries = redeliveries + 1"
                              " WHERE id = ?1");
          u.bind(1, *existing);
          u.exec();
        }
      } else if (existing) {
        SQLite::Statement u(db,
                            "UPDATE inbox_dead_letters SET reason = ?2, reason_text = ?3,"
                            " attempts = ?4, last_attempt_at = ?5, dead_lettered_at = ?6,"
                            " status = 'dead', replayed_at = NULL WHERE id = ?1");
        u.bind(1, *existing);
        u.bind(2, to_string(dl.reason));
        u.bind(3, dl.reason_text);
        u.bind(4, dl.attempts);
        u.bind(5, dl.last_attempt_at_ms);
        u.bind(6, now);
        if (u.exec() == 0) throw SQLite::Exception("dead letter to replace is gone", SQLITE_NOTFOUND);
        counted = true;
      }
      if (!existing) {
        SQLite::Statement q(db,
                            "INSERT INTO inbox_dead_letters (consumer_name, message_id, topic,"
                            " payload, payload_size, properties, qos, reason, reason_text,"
                            " attempts, first_attempt_at, last_attempt_at, dead_lettered_at,"
                            " retention_at)"
                            " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
        q.bind(1, dl.consumer_name);
        if (dl.message_id) q.bind(2, *dl.message_id);
        q.bind(3, dl.topic);
        q.bind(4, dl.payload.data(), static_cast<int>(dl.payload.size()));
        q.bind(5, dl.payload_size);
        q.bind(6, dl.properties_json);
        q.bind(7, dl.qos);
        q.bind(8, to_string(dl.reason));
        q.bind(9, dl.reason_text);
        q.bind(10, dl.attempts);
        q.bind(11, dl.first_attempt_at_ms ? dl.first_attempt_at_ms : now);
        q.bind(12, dl.last_attempt_at_ms ? dl.last_attempt_at_ms : now);
        q.bind(13, now);
        q.bind(14, m.retention_clock());
        q.exec();
        existing = db.getLastInsertRowid();
        counted = true;
      }
      if (dl.message_id) {
        SQLite::Statement& q = *m.delete_attempts;
        detail::StatementReset reset(q);
        q.bind(1, dl.consumer_name);
        q.bind(2, *dl.message_id);
        q.exec();
      }
      *id = *existing;
    });
  } catch (const SQLite::Exception& e) {
    if (e.getErrorCode() == SQLITE_NOTFOUND)
      return Status::NotFound("dead letter " + std::to_string(*replace_id) + " not found");
    return impl_->store_error(detail::to_status(e, "writing dead letter"));
  }
  if (counted) ++m.dead_lettered;
  return Status::Ok();
}

Status Inbox::list_dead_letters(const DeadLetterFilter& filter, std::vector<DeadLetter>* out) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  out->clear();
  try {
    FilterSql f = filter_sql(filter);
    std::string sql = std::string("SELECT ") + kDeadLetterColumns + " FROM inbox_dead_letters" +
                      f.where + " ORDER BY id DESC";
    if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);
    SQLite::Statement q(*impl_->db, sql);
    for (size_t i = 0; i < f.binds.size(); ++i) f.binds[i](q, static_cast<int>(i + 1));
    while (q.executeStep()) out->push_back(read_dead_letter(q));
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "listing dead letters"));
  }
  return Status::Ok();
}

Status Inbox::get_dead_letter(int64_t id, DeadLetter* out) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db, std::string("SELECT ") + kDeadLetterColumns +
                                        " FROM inbox_dead_letters WHERE id = ?1");
    q.bind(1, id);
    if (!q.executeStep()) return Status::NotFound("dead letter " + std::to_string(id) + " not found");
    *out = read_dead_letter(q);
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "reading dead letter"));
  }
  return Status::Ok();
}

Status Inbox::purge_dead_letters(const DeadLetterFilter& filter, int64_t* removed) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    FilterSql f = filter_sql(filter);
    impl_->write_transaction([&] {
      SQLite::Statement q(*impl_->db, "DELETE FROM inbox_dead_letters" + f.where);
      for (size_t i = 0; i < f.binds.size(); ++i) f.binds[i](q, static_cast<int>(i + 1));
      *removed = q.exec();
    });
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "purging dead letters"));
  }
  return Status::Ok();
}

Status Inbox::count_processed(const std::string& consumer, int64_t* rows) {
  if (impl_->fatal.load()) return impl_->fatal_status();
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    SQLite::Statement q(*impl_->db,
                        "SELECT count(*) FROM inbox_processed WHERE consumer_name = ?1");
    q.bind(1, consumer);
    q.executeStep();
    *rows = q.getColumn(0).getInt64();
  } catch (const SQLite::Exception& e) {
    return impl_->store_error(detail::to_status(e, "counting processed rows"));
  }
  return Status::Ok();
}

void Inbox::with_connection(const std::function<void(SQLite::Database&)>& fn) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->fatal.load()) throw SQLite::Exception(impl_->fatal_status().message(), SQLITE_CORRUPT);
  fn(*impl_->db);
}

}  // namespace mqtt_inbox
