// Issue 14: a first delivery costs one write transaction and one fsync, and a handler that
// kills the process is still counted (the running-attempt marker in the lock file, turned
// into an attempt row by the next open). Real SQLite files; real process deaths (fork, the
// child dies inside the handler); commits counted with sqlite3_commit_hook and fsyncs by
// the counting fault VFS. Also the in-place migration to schema version 4.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/sqlite/attempt_marker.h"
#include "store/sqlite/schema.h"
#include "support/fault_vfs.h"
#include "support/ledger_fixture.h"

#include <nlohmann/json.hpp>

namespace mqtt_inbox::test {
namespace {

int count_commit(void* n) {
  ++*static_cast<int*>(n);
  return 0;  // let it commit
}

class OneTransactionTest : public ::testing::Test {
 protected:
  void SetUp() override { db_path_ = dir_.file("inbox.db"); }

  std::unique_ptr<Consumer> consumer(Inbox* inbox, Handler handler, int max_attempts = 3) {
    ConsumerOptions o;
    o.max_attempts = max_attempts;
    o.retry_backoff_initial = std::chrono::milliseconds(1);
    o.retry_backoff_max = std::chrono::milliseconds(1);
    std::unique_ptr<Consumer> c;
    EXPECT_TRUE(Consumer::create(inbox, "ledger", std::move(handler), o, &c).ok());
    return c;
  }

  // Handles `m` in a forked child whose handler dies (SIGKILL) inside: a real death with
  // the marker written and nothing committed. Nothing of the parent's is open meanwhile.
  void die_inside_handler(const Message& m) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::unique_ptr<Inbox> inbox;
      if (!Inbox::open(db_path_, {}, &inbox).ok()) _exit(2);
      inbox->with_connection([](SQLite::Database& db) { ledger::create_tables(db); });
      std::unique_ptr<Consumer> c;
      if (!Consumer::create(
               inbox.get(), "ledger", [](SQLite::Database&, const Delivery&) { raise(SIGKILL); },
               {}, &c)
               .ok())
        _exit(3);
      c->handle(m);
      _exit(4);  // not reached
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "child status " << st;
  }

  int64_t q(const std::string& sql) { return query_int(db_path_, sql); }

  TempDir dir_;
  std::string db_path_;
};

// N new messages with synchronous=FULL: N commits and N fsyncs of the WAL, nothing more;
// the lookup read and the separate attempt commit are gone, and no attempt row is written.
TEST_F(OneTransactionTest, FirstDeliveryIsOneCommitAndOneFsync) {
  FaultVfs vfs("one_tx_vfs");
  InboxOptions o;
  o.vfs = vfs.name();
  auto inbox = open_ledger_inbox(db_path_, o);
  ASSERT_TRUE(inbox);
  int commits = 0;
  inbox->with_connection(
      [&](SQLite::Database& db) { sqlite3_commit_hook(db.getHandle(), count_commit, &commits); });
  auto c = consumer(inbox.get(), ledger::apply_credit);
  // The first statement after open may still settle the schema: warm up once.
  ASSERT_EQ(c->handle(credit_message("warm", "a", 1)), Outcome::kProcessed);
  commits = 0;
  vfs.reset_counters();
  constexpr int kMessages = 20;
  for (int i = 0; i < kMessages; ++i)
    ASSERT_EQ(c->handle(credit_message("m-" + std::to_string(i), "a", 1)), Outcome::kProcessed);
  EXPECT_EQ(commits, kMessages);
  EXPECT_EQ(vfs.counters(FileKind::kWal).syncs, static_cast<uint64_t>(kMessages));
  EXPECT_EQ(vfs.counters(FileKind::kMainDb).syncs, 0u);  // no checkpoint in 20 commits
  // A duplicate commits nothing at all.
  commits = 0;
  EXPECT_EQ(c->handle(credit_message("m-3", "a", 1)), Outcome::kDuplicate);
  EXPECT_EQ(commits, 0);
  inbox->with_connection(
      [](SQLite::Database& db) { sqlite3_commit_hook(db.getHandle(), nullptr, nullptr); });
  c.reset();
  inbox.reset();
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'a'"), kMessages + 1);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
}

// The connection that runs messages has applied no schema step: a step that renames a
// table (ALTER TABLE ... RENAME, steps 5, 7 and 9) opens the connection's TEMP database, and
// every later BEGIN IMMEDIATE would then open and commit a write transaction there too.
// PRAGMA database_list names 'temp' once it is open.
TEST_F(OneTransactionTest, MessagesRunOnAConnectionWithoutATempDatabase) {
  for (int open = 0; open < 2; ++open) {  // the file is made, then reopened
    SCOPED_TRACE(open == 0 ? "new file" : "reopened");
    auto inbox = open_ledger_inbox(db_path_);
    ASSERT_TRUE(inbox);
    std::vector<std::string> names;
    inbox->with_connection([&](SQLite::Database& db) {
      SQLite::Statement q(db, "PRAGMA database_list");
      while (q.executeStep()) names.push_back(q.getColumn(1).getString());
    });
    EXPECT_EQ(names, std::vector<std::string>{"main"});
    auto c = consumer(inbox.get(), ledger::apply_credit);
    EXPECT_EQ(c->handle(credit_message("t-" + std::to_string(open), "a", 1)), Outcome::kProcessed);
  }
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'a'"), 2);
}

// The WAL file keeps one checkpoint cycle's size: after a checkpoint resets the WAL,
// journal_size_limit (sized by the inbox) leaves the file as long as a cycle's frames, so
// no commit has to grow it again (a grown file makes the commit's fdatasync also commit
// the new size) and no reset cuts it. The file's size only ever grows during the stream.
TEST_F(OneTransactionTest, CheckpointCyclesNeitherCutNorRegrowTheWal) {
  InboxOptions o;
  o.synchronous = Synchronous::kNormal;  // the file's size is under test, not fsync
  o.wal_autocheckpoint_pages = 100;
  auto inbox = open_ledger_inbox(db_path_, o);
  auto c = consumer(inbox.get(), ledger::apply_credit);
  const auto wal_size = [&] {
    struct stat st {};
    return ::stat((db_path_ + "-wal").c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
  };
  int64_t high = 0, cut = 0;
  for (int i = 0; i < 1500; ++i) {  // about 15 cycles of 100 frames
    ASSERT_EQ(c->handle(credit_message("cycle-" + std::to_string(i), "a", 1)), Outcome::kProcessed);
    const int64_t now = wal_size();
    if (now < high) ++cut;
    high = std::max(high, now);
  }
  EXPECT_EQ(cut, 0) << "the WAL file was cut " << cut << " times; high-water mark " << high;
  // The cycles happened: the file reached about one cycle's size (100 frames + header),
  // and checkpoints kept it there.
  EXPECT_GE(high, 100 * (4096 + 24));
  EXPECT_LT(high, 2 * 100 * (4096 + 24));
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 1500);
}

// One JSON parse per message: the consumer's id extraction from the JSON field parses the
// payload, and the handler gets that document (Delivery::payload_json) instead of parsing
// it again. An id from a user property alone parses nothing; the ledger handler then
// parses it itself (payload_json.h), with the same business result.
TEST_F(OneTransactionTest, TheHandlerReadsTheParseTheIdExtractionMade) {
  auto inbox = open_ledger_inbox(db_path_);
  const nlohmann::json* seen = reinterpret_cast<const nlohmann::json*>(1);
  int64_t amount_seen = 0;
  auto c = consumer(inbox.get(), [&](SQLite::Database& db, const Delivery& d) {
    seen = d.payload_json;
    if (seen) amount_seen = seen->at("amount").get<int64_t>();
    ledger::apply_credit(db, d);
  });
  ASSERT_EQ(c->handle(credit_message("j-1", "a", 7)), Outcome::kProcessed);
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(amount_seen, 7);

  ConsumerOptions by_property;
  by_property.message_id.json_field.clear();
  std::unique_ptr<Consumer> p;
  ASSERT_TRUE(Consumer::create(
                  inbox.get(), "by-property",
                  [&](SQLite::Database& db, const Delivery& d) {
                    seen = d.payload_json;
                    ledger::apply_credit(db, d);
                  },
                  by_property, &p)
                  .ok());
  Message m = credit_message("j-2", "a", 5);
  m.user_properties = {{"message-id", "j-2"}};
  ASSERT_EQ(p->handle(m), Outcome::kProcessed);
  EXPECT_EQ(seen, nullptr);
  c.reset();
  p.reset();
  inbox.reset();
  EXPECT_EQ(q("SELECT balance FROM accounts WHERE account = 'a'"), 12);
  EXPECT_EQ(q("SELECT count(*) FROM ledger_entries"), 2);
}

// While the handler runs, nothing about the attempt is in the database (the marker holds
// it). Without the lock file (exclusive = false) there is no marker: a redelivery's attempt
// (DUP set) is committed first, a first delivery's is not, as on every store without one
// (docs/design.md#attempts-and-crash-loops).
TEST_F(OneTransactionTest,
       AttemptIsInTheDatabaseDuringTheHandlerOnlyForARedeliveryWithoutTheLockFile) {
  for (const bool exclusive : {true, false}) {
    for (const bool dup : {false, true}) {
      SCOPED_TRACE(std::string(exclusive ? "exclusive" : "not exclusive") +
                   (dup ? ", redelivery" : ", first delivery"));
      InboxOptions o;
      o.exclusive = exclusive;
      auto inbox = open_ledger_inbox(db_path_, o);
      int64_t seen = -1;
      auto c = consumer(inbox.get(), [&](SQLite::Database& db, const Delivery& d) {
        seen = query_int(db_path_, "SELECT count(*) FROM inbox_attempts WHERE message_id = '" +
                                       d.message_id + "'");
        ledger::apply_credit(db, d);
      });
      const std::string id =
          std::string("x-") + (exclusive ? "e" : "n") + (dup ? "-dup" : "-first");
      Message m = credit_message(id, "a", 1);
      m.dup = dup;
      ASSERT_EQ(c->handle(m), Outcome::kProcessed);
      EXPECT_EQ(seen, !exclusive && dup ? 1 : 0);
      EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);  // gone with the commit
    }
  }
}

// A process that dies inside the handler on a first delivery leaves no row, only the
// marker; the next open counts it as a 'running' attempt, once, and the next delivery runs
// as attempt 2. With max_attempts = 1 the next delivery is dead-lettered as crashed.
TEST_F(OneTransactionTest, DeathInsideTheHandlerIsCountedAtTheNextOpen) {
  const Message m = credit_message("boom-1", "a", 5);
  die_inside_handler(m);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);  // nothing was committed for it

  auto inbox = open_ledger_inbox(db_path_);
  EXPECT_EQ(q("SELECT attempts FROM inbox_attempts WHERE message_id = 'boom-1'"
              " AND state = 'running'"),
            1);
  int attempt_seen = 0;
  auto c = consumer(inbox.get(), [&](SQLite::Database& db, const Delivery& d) {
    attempt_seen = d.attempt;
    ledger::apply_credit(db, d);
  });
  EXPECT_EQ(c->handle(m), Outcome::kProcessed);
  EXPECT_EQ(attempt_seen, 2);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);
  EXPECT_EQ(q("SELECT balance FROM accounts"), 5);

  // Reopening again finds no marker: nothing is counted twice.
  c.reset();
  inbox.reset();
  inbox = open_ledger_inbox(db_path_);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_attempts"), 0);

  c.reset();
  inbox.reset();
  const Message crashy = credit_message("boom-2", "a", 7);
  die_inside_handler(crashy);
  inbox = open_ledger_inbox(db_path_);
  int calls = 0;
  c = consumer(
      inbox.get(), [&](SQLite::Database&, const Delivery&) { ++calls; }, /*max_attempts=*/1);
  EXPECT_EQ(c->handle(crashy), Outcome::kDeadLettered);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(q("SELECT count(*) FROM inbox_dead_letters WHERE message_id = 'boom-2'"
              " AND reason = 'handler_crashed' AND attempts = 1"),
            1);
}

// A prepared marker writes through a shared mapping of the lock file's first page, not
// pwrite: what it writes must be what another descriptor (the next open, after a death)
// reads, and a clear must be seen the same way.
TEST_F(OneTransactionTest, MappedMarkerIsReadThroughAnotherDescriptor) {
  { auto inbox = open_ledger_inbox(db_path_); }
  const std::string lock = db_path_ + ".lock";
  const int fd = ::open(lock.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const auto read_elsewhere = [&](detail::AttemptMarker::Entry* e) {
    const int other = ::open(lock.c_str(), O_RDWR);
    detail::AttemptMarker reader(other);
    const bool found = reader.read(e);
    ::close(other);
    return found;
  };
  {
    detail::AttemptMarker marker(fd);
    ASSERT_TRUE(marker.prepare());
    ASSERT_TRUE(marker.set("ledger", "a-rather-longer-id-than-the-next"));
    ASSERT_TRUE(marker.set("ledger", "mapped-1"));  // overwrites a longer record
    detail::AttemptMarker::Entry e;
    ASSERT_TRUE(read_elsewhere(&e));
    EXPECT_EQ(e.consumer, "ledger");
    EXPECT_EQ(e.message_id, "mapped-1");
    marker.clear();
    EXPECT_FALSE(read_elsewhere(&e));
    ASSERT_TRUE(marker.set("ledger", "mapped-2"));
  }  // unmapped here; the store stays in the file, as after a death
  ::close(fd);
  { auto inbox = open_ledger_inbox(db_path_); }
  EXPECT_EQ(q("SELECT coalesce(max(attempts), 0) FROM inbox_attempts WHERE message_id = "
              "'mapped-2'"),
            1);
}

// The marker is turned into an attempt only when that attempt can have been lost: not
// twice for the same marker (a death between the conversion and clearing it), not for an
// id that committed or was dead-lettered just before the death, not from a torn record.
TEST_F(OneTransactionTest, MarkerIsCountedOnlyWhenTheAttemptCanHaveBeenLost) {
  { auto inbox = open_ledger_inbox(db_path_); }
  const std::string lock = db_path_ + ".lock";
  const auto leave_marker = [&](const std::string& id) {
    const int fd = ::open(lock.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    detail::AttemptMarker marker(fd);
    ASSERT_TRUE(marker.set("ledger", id));
    detail::AttemptMarker::Entry e;
    ASSERT_TRUE(marker.read(&e));  // what the next open reads
    EXPECT_EQ(e.message_id, id);
    ::close(fd);
  };
  const auto reopen = [&] { auto inbox = open_ledger_inbox(db_path_); };
  const auto attempts = [&](const std::string& id) {
    return q("SELECT coalesce(max(attempts), 0) FROM inbox_attempts WHERE message_id = '" + id +
             "'");
  };

  leave_marker("lost-1");
  reopen();
  EXPECT_EQ(attempts("lost-1"), 1);
  reopen();  // the conversion cleared it
  EXPECT_EQ(attempts("lost-1"), 1);

  // A death after the conversion committed but before the marker was cleared: the same
  // record (same nonce) is read again and must not count twice.
  {
    const int fd = ::open(lock.c_str(), O_RDWR);
    detail::AttemptMarker marker(fd);
    ASSERT_TRUE(marker.set("ledger", "lost-2"));
    std::string saved(4096, '\0');
    ASSERT_GT(::pread(fd, &saved[0], saved.size(), 0), 0);
    ::close(fd);
    reopen();
    EXPECT_EQ(attempts("lost-2"), 1);
    const int fd2 = ::open(lock.c_str(), O_RDWR);
    ASSERT_EQ(::pwrite(fd2, saved.data(), saved.size(), 0), static_cast<ssize_t>(saved.size()));
    ::close(fd2);
    reopen();
    EXPECT_EQ(attempts("lost-2"), 1);
  }

  // Committed just before the death: nothing to count.
  {
    auto inbox = open_ledger_inbox(db_path_);
    auto c = consumer(inbox.get(), ledger::apply_credit);
    ASSERT_EQ(c->handle(credit_message("done-1", "a", 1)), Outcome::kProcessed);
  }
  leave_marker("done-1");
  reopen();
  EXPECT_EQ(attempts("done-1"), 0);

  // A torn record (the death came during its write, before the handler started).
  {
    const int fd = ::open(lock.c_str(), O_RDWR);
    detail::AttemptMarker marker(fd);
    ASSERT_TRUE(marker.set("ledger", "torn-1"));
    const char junk = 'X';
    ASSERT_EQ(::pwrite(fd, &junk, 1, 20), 1);  // inside the body: the checksum fails
    ::close(fd);
  }
  reopen();
  EXPECT_EQ(attempts("torn-1"), 0);
}

// A schema step drops the received_at index. A database of the version before it (every
// earlier step, the index included) with rows is migrated in place: rows kept, index gone,
// old ids still deduplicate, and the pruner still finds the expired ones without the index.
TEST(MigrationDropsReceivedAtIndex, PreviousVersionDatabaseLosesTheIndexAndKeepsItsRows) {
  TempDir dir;
  const std::string path = dir.file("previous.db");
  int previous = 0;  // the version before the step that drops the index
  for (const auto& step : detail::schema_steps())
    if (step.sql.find("DROP INDEX IF EXISTS inbox_processed_received_at") != std::string::npos)
      break;
    else
      previous = step.version;
  ASSERT_GT(previous, 0);
  ASSERT_LT(previous, kSchemaVersion);
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    db.exec("PRAGMA journal_mode = WAL");
    for (const auto& step : detail::schema_steps())
      if (step.version <= previous) db.exec(step.sql);
    ASSERT_EQ(db.execAndGet("PRAGMA user_version").getInt(), previous);
    ASSERT_TRUE(db.execAndGet("SELECT count(*) FROM sqlite_master WHERE name ="
                              " 'inbox_processed_received_at'")
                    .getInt() == 1);
    db.exec(
        "INSERT INTO inbox_processed (consumer_name, message_id, received_at)"
        " VALUES ('ledger', 'old-1', 1000), ('ledger', 'old-2', 2000)");
  }
  std::unique_ptr<Inbox> inbox;
  ASSERT_TRUE(Inbox::open(path, {}, &inbox).ok());
  inbox->with_connection([](SQLite::Database& db) { ledger::create_tables(db); });
  EXPECT_EQ(query_int(path, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(query_int(path,
                      "SELECT count(*) FROM sqlite_master WHERE name ="
                      " 'inbox_processed_received_at'"),
            0);
  EXPECT_EQ(query_int(path, "SELECT count(*) FROM inbox_processed"), 2);
  {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    EXPECT_EQ(db.execAndGet("PRAGMA integrity_check").getString(), "ok");
  }

  std::unique_ptr<Consumer> c;
  ASSERT_TRUE(Consumer::create(inbox.get(), "ledger", ledger::apply_credit, {}, &c).ok());
  EXPECT_EQ(c->handle(credit_message("old-1", "a", 1)), Outcome::kDuplicate);
  EXPECT_EQ(c->handle(credit_message("new-1", "a", 1)), Outcome::kProcessed);

  RetentionOptions r;
  r.broker_session_expiry = std::chrono::minutes(1);
  r.margin = std::chrono::minutes(1);
  r.window = std::chrono::minutes(10);
  r.stats_log_period_ms = 0;
  std::unique_ptr<Pruner> pruner;
  ASSERT_TRUE(Pruner::create(inbox.get(), r, &pruner).ok());
  PruneResult pr;
  ASSERT_TRUE(pruner->prune_once(&pr).ok());
  EXPECT_EQ(pr.processed_deleted, 2);  // received_at 1000 and 2000: long expired
  EXPECT_EQ(query_int(path, "SELECT count(*) FROM inbox_processed"), 1);
}

}  // namespace
}  // namespace mqtt_inbox::test
