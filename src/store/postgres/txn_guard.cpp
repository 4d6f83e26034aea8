// The library's transactions on PostgreSQL and a handler's run in one (backend.h): PgWork,
// the notices that tell what a handler ran, and the facts of a handler's run read from the
// connection's transaction status (libpq's PQtransactionStatus).
#include <libpq-fe.h>

#include <cstring>
#include <string>

#include "store/postgres/backend.h"
#include "store/postgres/errors.h"
#include "store/verdict.h"

namespace mqtt_inbox::detail {

namespace {

// What the handler ran when the check finds a transaction that is not the library's.
constexpr const char* kNotOursHow =
    "ROLLBACK (or COMMIT) and then BEGIN: the transaction the library was to commit is not "
    "the one it began";

bool is_not_ours(const std::exception& e) { return std::strstr(e.what(), kPgNotOurs) != nullptr; }

}  // namespace

PgWork::PgWork(pqxx::connection_base& c, bool guarded)
    : pqxx::internal::namedclass{"mqtt_inbox::PgWork"},
      pqxx::dbtransaction(c, "READ COMMITTED", pqxx::read_write),
      guarded_(guarded) {
  Begin();
}

PgWork::~PgWork() noexcept {
  library_ = true;  // the rollback of a transaction left open is the library's own
  End();
}

void PgWork::do_begin() {
  // The connections handlers run on read only by default (backend.h): the library's own
  // transactions say READ WRITE. A handler's is marked and guarded from its first
  // statement (open.cpp, guard_sql).
  direct_exec(guarded_ ? "BEGIN READ WRITE; SELECT pg_temp.mqtt_inbox_txn_begin()"
                       : "BEGIN READ WRITE");
}

pqxx::result PgWork::do_exec(const char query[]) {
  // libpqxx rolls back at once when a statement fails; the store does it itself, after it
  // read what the handler left (a failed transaction block it went on in).
  return direct_exec(query);
}

void PgWork::do_commit() {
  if (guarded_ && !library_) {
    ended_ = "commit() on the transaction";
    throw pqxx::usage_error("mqtt-inbox: a handler may not commit the library's transaction");
  }
  try {
    // The check stops the string where it fails: nothing after it runs, COMMIT included.
    direct_exec(guarded_ ? "SELECT pg_temp.mqtt_inbox_txn_check();"
                           " SET LOCAL mqtt_inbox.commit = 'on'; COMMIT"
                         : "COMMIT");
    unconfirmed_ = false;
  } catch (const pqxx::statement_completion_unknown& e) {
    throw pqxx::in_doubt_error(e.what());
  } catch (const std::exception& e) {
    // The connection lost while committing: nobody here can tell whether it committed.
    if (!conn().is_open()) throw pqxx::in_doubt_error(e.what());
    if (guarded_ && is_not_ours(e)) throw TransactionNotOurs(kNotOursHow);
    throw;
  }
}

void PgWork::confirm_ours() {
  try {
    direct_exec("SELECT pg_temp.mqtt_inbox_txn_check()");
  } catch (const std::exception& e) {
    if (is_not_ours(e)) throw TransactionNotOurs(kNotOursHow);
    throw;
  }
  unconfirmed_ = false;
}

void PgWork::do_abort() {
  if (guarded_ && !library_ && !*ended_) ended_ = "abort() on the transaction";
  direct_exec("ROLLBACK");
}

void PgWork::commit_by_library() {
  library_ = true;
  commit();
}

void PgWork::abort_by_library() noexcept {
  library_ = true;
  try {
    abort();
  } catch (...) {
    // A lost connection rolls back by itself.
  }
}

bool PgNoticeWatch::operator()(const char msg[]) noexcept {
  if (std::strstr(msg, "mqtt-inbox: the handler ran COMMIT")) commit_refused = true;
  if (std::strstr(msg, "there is already a transaction in progress")) begin_ignored = true;
  return true;
}

void run_pg_handler(PgConnection& conn, PgWork& w, PgNoticeWatch& watch, const Inbox* owner,
                    FunctionRef<void(const TxnRef&)> call, HandlerRun* out) {
  watch.reset();
  pqxx::transaction_base& base = w;
  const TxnRef txn{&base, &typeid(pqxx::transaction_base*)};
  out->verdict = run_handler(owner, &classify_pg_exception, [&] { call(txn); });
  PGconn* pg = conn.raw();
  if (!pg || !conn.is_open()) {
    // Closed by the handler (disconnect() on its connection), or lost: a lost connection
    // shows as the store error the handler threw or the next statement meets.
    if (out->verdict.kind == HandlerVerdict::Kind::kStoreError) return;
    out->left = TxnLeft::kClosed;
    out->how = "disconnect() on the inbox's connection";
    return;
  }
  const PGTransactionStatusType status = PQtransactionStatus(pg);
  if (*w.handler_ended()) {
    out->left = TxnLeft::kEnded;
    out->how = w.handler_ended();
  } else if (watch.commit_refused) {
    out->left = TxnLeft::kEnded;
    out->how = "COMMIT (refused: the whole transaction rolled back)";
  } else if (watch.begin_ignored) {
    out->left = TxnLeft::kEnded;
    out->how = "BEGIN";
  } else if (status == PQTRANS_IDLE) {
    out->left = TxnLeft::kEnded;
    out->how = "ROLLBACK (or ABORT, END)";
  } else if (status == PQTRANS_INERROR) {
    out->left = TxnLeft::kAborted;
    out->how = "a statement failed and the handler went on";
  } else {
    // Open, as far as the client can tell: whether it is still the library's, the next
    // statement of the library or its COMMIT checks (ROLLBACK then BEGIN leaves no trace
    // the client sees).
    w.set_handler_ran();
  }
}

}  // namespace mqtt_inbox::detail
