// Issue 13, part 4: a corrupt database. A page of the file is overwritten with `dd`
// while the example consumer is stopped; then it is started and credits are published.
// On SQLITE_CORRUPT or SQLITE_NOTADB, on the message path or at open, the consumer must
// stop taking messages (no PUBACK), say what to do, and never delete, recreate or write
// the file. What the broker still holds is checked by putting a good copy in place and
// starting again: every credit published meanwhile must arrive and apply once.
// docs/operations.md#recovering-a-corrupt-database is followed to the letter on the
// corrupt file.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>

#include "support/example_fixture.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class CorruptionTest : public ExampleProgramTest {
 protected:
  // A database with `n` credits applied, the consumer stopped cleanly (WAL checkpointed
  // into the file), and a good copy of it kept aside.
  void make_database_with_credits(int n) {
    create_session([&](const std::string& log) { return start_ledger(log); });
    auto c = start_ledger("first.log");
    ASSERT_GT(publish("credits/a", n, "a", "pub-a.log"), 0);
    ASSERT_TRUE(
        wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == n; }, seconds(30)));
    c->signal(SIGTERM);
    const int st = c->wait(seconds(20));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    ASSERT_NE(::access((db_ + "-wal").c_str(), F_OK), 0) << "the WAL was not checkpointed at stop";
    std::filesystem::copy_file(db_, good_copy());
  }
  std::string good_copy() const { return dir_.file("good.db"); }

  // `dd` writes `count` bytes of zeros at byte `offset` of the database, in place.
  void dd_zeros(int64_t offset, int64_t count) {
    Child dd({"/bin/dd", "if=/dev/zero", "of=" + db_, "bs=1", "seek=" + std::to_string(offset),
              "count=" + std::to_string(count), "conv=notrunc"},
             dir_.file("dd.log"));
    const int st = dd.wait(seconds(20));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_text(dir_.file("dd.log"));
  }

  static ino_t inode_of(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
  }

  // Stops a consumer whose callback holds a message it cannot store: exit code 3 within
  // stop_timeout_ms (1000 here) plus four seconds (a loaded machine exits slowly).
  void expect_stops_without_ack(Child& c, const std::string& log) {
    const auto t0 = std::chrono::steady_clock::now();
    c.signal(SIGTERM);
    const int st = c.wait(seconds(10));
    const auto took =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3) << "status " << st << "\n"
                                                       << read_text(dir_.file(log));
    EXPECT_LT(took.count(), 5000);
  }

  // The good copy in place of the corrupt file, and a consumer on it: every credit that
  // was published while the file was corrupt arrives (none was acked) and applies once.
  void expect_broker_still_holds(int before, int published, int64_t published_total,
                                 int64_t total_before) {
    std::filesystem::remove(db_ + "-wal");
    std::filesystem::remove(db_ + "-shm");
    std::filesystem::copy_file(good_copy(), db_, std::filesystem::copy_options::overwrite_existing);
    auto c = start_ledger("good.log");
    EXPECT_TRUE(
        wait_until([&] { return q("SELECT count(*) FROM ledger_entries") == before + published; },
                   seconds(30)))
        << "ledger rows: " << q("SELECT count(*) FROM ledger_entries") << "\n"
        << read_text(dir_.file("good.log")) << "\n---- corrupt run:\n"
        << read_text(dir_.file("corrupt.log"));
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), before + published);
    EXPECT_EQ(q("SELECT count(DISTINCT message_id) FROM ledger_entries"), before + published);
    EXPECT_EQ(q("SELECT sum(amount) FROM ledger_entries"), total_before + published_total);
    c->signal(SIGTERM);
    c->wait(seconds(20));
  }
};

// A page of the application's table is damaged: the inbox opens, and the first credit's
// handler runs into it. Nothing is acked, the log says what to do, the file stays as dd
// left it, and the recovery procedure of docs/operations.md#recovering-a-corrupt-database
// works on it.
TEST_F(CorruptionTest, CorruptPageOnTheMessagePathStopsTakingMessagesAndLeavesTheFile) {
  make_database_with_credits(5);
  const int64_t total_before = q("SELECT sum(amount) FROM ledger_entries");
  const int64_t page = q("PRAGMA page_size");
  const int64_t root = q("SELECT rootpage FROM sqlite_master WHERE name = 'ledger_entries'");
  ASSERT_GT(root, 1);
  dd_zeros((root - 1) * page, page);
  const std::string corrupt_bytes = read_text(db_);
  const ino_t inode = inode_of(db_);
  const size_t connections_before = broker_connections();

  const int64_t published_total = publish("credits/b", 10, "b", "pub-b.log");
  ASSERT_GT(published_total, 0);
  auto c = start_ledger("corrupt.log", {"--stop-timeout-ms", "1000"});
  ASSERT_TRUE(wait_until(
      [&] { return read_text(dir_.file("corrupt.log")).find("is unusable") != std::string::npos; },
      seconds(30)))
      << read_text(dir_.file("corrupt.log"));
  const std::string log = read_text(dir_.file("corrupt.log"));
  EXPECT_NE(log.find(db_), std::string::npos) << "the log does not name the file";
  EXPECT_NE(log.find("docs/operations.md#recovering-a-corrupt-database"), std::string::npos);
  EXPECT_NE(log.find(".dump"), std::string::npos);
  EXPECT_EQ(broker_connections(), connections_before + 1);
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_TRUE(c->running()) << "the consumer returned from the callback (that acks)";
  expect_stops_without_ack(*c, "corrupt.log");

  EXPECT_EQ(inode_of(db_), inode) << "the file was deleted or recreated";
  EXPECT_TRUE(read_text(db_) == corrupt_bytes) << "the corrupt file was written to";

  // docs/operations.md#recovering-a-corrupt-database, word for word: Debian 12's sqlite3 has no
  // .recover (built without the sqlite_dbpage table), so .dump into a new file.
  const std::string recovered = dir_.file("recovered.db");
  const std::string script =
      "set -e; V=$(sqlite3 '" + db_ +
      "' 'PRAGMA user_version'); "
      "{ echo 'PRAGMA auto_vacuum = INCREMENTAL;'; "
      "  sqlite3 '" +
      db_ +
      "' .dump | sed 's/^ROLLBACK; -- due to errors$/COMMIT;/'; "
      "  echo \"PRAGMA user_version = $V; PRAGMA journal_mode = WAL;\"; } | sqlite3 '" +
      recovered + "'";
  Child recover({"/bin/sh", "-c", script}, dir_.file("recover.log"));
  ASSERT_EQ(recover.wait(seconds(30)), 0) << read_text(dir_.file("recover.log"));
  Child check({built_program("mqtt-inbox"), "check", recovered}, dir_.file("check.log"));
  const int check_status = check.wait(seconds(30));
  EXPECT_TRUE(WIFEXITED(check_status) && WEXITSTATUS(check_status) == 0)
      << read_text(dir_.file("check.log"));
  // What the damaged page held is lost: its ledger rows; the claims survived.
  EXPECT_EQ(query_int(recovered, "SELECT count(*) FROM inbox_processed"), 5);
  EXPECT_LT(query_int(recovered, "SELECT count(*) FROM ledger_entries"), 5);

  expect_broker_still_holds(5, 10, published_total, total_before);
}

// The schema page is damaged: the consumer stops at open with exit code 5, before it
// connects, and leaves the file as it was.
TEST_F(CorruptionTest, CorruptSchemaAtOpenExitsWithCode5BeforeConnecting) {
  make_database_with_credits(3);
  const int64_t total_before = q("SELECT sum(amount) FROM ledger_entries");
  const int64_t page = q("PRAGMA page_size");
  dd_zeros(100, page - 100);  // page 1 after the file header: the schema's b-tree
  const std::string corrupt_bytes = read_text(db_);
  const size_t connections_before = broker_connections();

  const int64_t published_total = publish("credits/c", 7, "c", "pub-c.log");
  ASSERT_GT(published_total, 0);
  auto c = start_ledger("corrupt-open.log");
  const int st = c->wait(seconds(20));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 5) << "status " << st << "\n"
                                                     << read_text(dir_.file("corrupt-open.log"));
  EXPECT_NE(read_text(dir_.file("corrupt-open.log"))
                .find("docs/operations.md#recovering-a-corrupt-database"),
            std::string::npos);
  EXPECT_EQ(broker_connections(), connections_before) << "connected with a corrupt store";
  EXPECT_TRUE(read_text(db_) == corrupt_bytes) << "the corrupt file was written to";

  // `mqtt-inbox check` reports it (exit 2) with the way out.
  Child check({built_program("mqtt-inbox"), "check", db_}, dir_.file("check.log"));
  const int check_status = check.wait(seconds(30));
  EXPECT_TRUE(WIFEXITED(check_status) && WEXITSTATUS(check_status) == 2)
      << read_text(dir_.file("check.log"));
  EXPECT_NE(read_text(dir_.file("check.log")).find(".dump"), std::string::npos)
      << read_text(dir_.file("check.log"));
  EXPECT_TRUE(read_text(db_) == corrupt_bytes) << "check wrote to the corrupt file";

  expect_broker_still_holds(3, 7, published_total, total_before);
}

}  // namespace
}  // namespace mqtt_inbox::test
