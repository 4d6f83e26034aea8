// The PostgreSQL store's retention (store/retention_rows.h): each batch is one DELETE of
// up to `limit` rows older than the cutoff on the server's clock (received_at), in its own
// short transaction (the outbox's sent and dead rows likewise, by retention_at); autovacuum gives
// the space back, so there is no checkpoint or vacuum step. The horizon the Pruner validates is
// recorded in inbox_meta for the admin tool. docs/postgres.md#retention says when time partitioning
// is worth it.
#include "store/retention_rows.h"

#include <pqxx/pqxx>

#include <chrono>
#include <map>
#include <mutex>

#include "store/postgres/backend.h"

namespace mqtt_inbox::detail {

namespace {

int64_t us_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

class PgRetentionSweep final : public RetentionSweep {
 public:
  explicit PgRetentionSweep(PgBackend& store) : s_(store) {}

  Status delete_expired_claims(int64_t cutoff, int64_t limit, RetentionBatch* out) override {
    *out = RetentionBatch{};
    const std::string p = s_.t("inbox_processed");
    return batch(
        "DELETE FROM " + p + " WHERE ctid = ANY(ARRAY(SELECT ctid FROM " + p +
            " WHERE received_at < to_timestamp($1 / 1000.0) ORDER BY received_at LIMIT $2))",
        cutoff, limit, out);
  }

  Status delete_expired(ExpiringRows rows, int64_t cutoff, int64_t limit,
                        RetentionBatch* out) override {
    *out = RetentionBatch{};
    if (rows != ExpiringRows::kDeadLetters) {
      // The outbox's finished rows, by the retention clock stamped when they became sent or
      // dead (the server's clock, as every stamp of this store).
      const std::string m = s_.t("outbox_messages");
      const char* state = rows == ExpiringRows::kOutboxSent ? "sent" : "dead";
      return batch("DELETE FROM " + m + " WHERE seq IN (SELECT seq FROM " + m + " WHERE state = '" +
                       state + "' AND retention_at < $1 ORDER BY retention_at LIMIT $2)",
                   cutoff, limit, out);
    }
    const std::string d = s_.t("inbox_dead_letters");
    // A 'requeued' row is work still to do: never pruned, however old.
    return batch("DELETE FROM " + d + " WHERE id IN (SELECT id FROM " + d +
                     " WHERE retention_at < $1 AND status <> 'requeued'"
                     " ORDER BY retention_at LIMIT $2)",
                 cutoff, limit, out);
  }

  void after_batch() override {}
  Status reclaim_step(ReclaimStep* out) override {
    *out = ReclaimStep{};
    return Status::Ok();
  }
  void finish_pass() override {}
  Status measure_rows() override { return s_.measure_rows(); }

 private:
  Status batch(const std::string& sql, int64_t cutoff, int64_t limit, RetentionBatch* out) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = s_.with_txn("deleting expired rows", [&](PgWork& w) {
      out->deleted = static_cast<int64_t>(w.exec_params(sql, cutoff, limit).affected_rows());
    });
    if (!s.ok()) return s;
    out->found = out->deleted;
    out->wrote = true;
    out->write_us = us_since(t0);
    return s;
  }

  PgBackend& s_;
};

class PgRetentionRows final : public RetentionRows {
 public:
  explicit PgRetentionRows(PgBackend& store) : s_(store) {}

  Status record_required_window(int64_t required_ms, int) override {
    return s_.with_txn("recording the retention horizon", [&](PgWork& w) {
      w.exec_params0("INSERT INTO " + s_.t("inbox_meta") +
                         " (key, value) VALUES ('required_window_ms', $1)"
                         " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                     std::to_string(required_ms));
    });
  }

  Status persist_clock() override { return Status::Ok(); }  // the server's clock: nothing kept

  Status open_sweep(const RetentionSweepOptions&, std::unique_ptr<RetentionSweep>* out) override {
    *out = std::make_unique<PgRetentionSweep>(s_);
    return Status::Ok();
  }

 private:
  PgBackend& s_;
};

}  // namespace

std::unique_ptr<RetentionRows> make_pg_retention_rows(PgBackend& store) {
  return std::make_unique<PgRetentionRows>(store);
}

Status PgBackend::measure_rows() {
  std::map<std::string, ConsumerRows> rows;
  OutboxRows outbox;
  const Status s = with_txn("measuring rows", [&](PgWork& w) {
    rows.clear();
    // The outbox: per class from outbox_usage (kept by its trigger), the rest from the
    // partial index of each state.
    outbox = OutboxRows{};
    for (const pqxx::row& r :
         w.exec("SELECT class, rows, bytes, dropped FROM " + t("outbox_usage")))
      outbox.classes[r[0].as<std::string>()] = {r[1].as<int64_t>(), r[2].as<int64_t>(),
                                                r[3].as<int64_t>()};
    const std::string m = t("outbox_messages");
    const pqxx::row n = w.exec1("SELECT (SELECT count(*) FROM " + m +
                                " WHERE state = 'sent'), (SELECT count(*) FROM " + m +
                                " WHERE state = 'dead'), (SELECT enqueued_clock FROM " + m +
                                " WHERE state = 'pending' ORDER BY seq LIMIT 1)");
    outbox.sent_rows = n[0].as<int64_t>();
    outbox.dead_rows = n[1].as<int64_t>();
    if (!n[2].is_null())
      outbox.oldest_pending_age_ms = std::max<int64_t>(0, retention_clock() - n[2].as<int64_t>());
    for (const pqxx::row& r :
         w.exec("SELECT consumer_name, count(*),"
                " (extract(epoch from min(received_at)) * 1000)::bigint,"
                " (extract(epoch from max(received_at)) * 1000)::bigint FROM " +
                t("inbox_processed") + " GROUP BY consumer_name")) {
      ConsumerRows c;
      c.rows = r[1].as<int64_t>();
      c.oldest_received_at = r[2].as<int64_t>();
      c.newest_received_at = r[3].as<int64_t>();
      rows[r[0].as<std::string>()] = c;
    }
  });
  if (!s.ok()) return s;
  front().set_row_stats(std::move(rows), std::move(outbox));
  return Status::Ok();
}

}  // namespace mqtt_inbox::detail
