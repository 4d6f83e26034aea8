// Issue 13, part 5: files created under another user. Two real users are created for the
// test (useradd; skipped with the reason when not root): the service user owns the
// database; an operator runs sqlite3 on it while the consumer is stopped, which leaves
// -wal and -shm owned by the operator. The consumer, started as the service user, must
// refuse before it connects, naming the file and its owner (exit code 6), instead of
// failing every write with "attempt to write a readonly database"; once the owner is
// fixed it starts. The admin tool, run as the operator, refuses before creating anything.
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>

#include <random>

#include "support/example_fixture.h"

namespace mqtt_inbox::test {
namespace {

using std::chrono::seconds;

// A user that exists for the life of the object.
class TestUser {
 public:
  explicit TestUser(const std::string& prefix) {
    std::random_device rd;
    name_ = prefix + std::to_string(rd() % 1000000);
    Child add({"/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name_});
    const int st = add.wait(seconds(20));
    ok_ = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (passwd* pw = ::getpwnam(name_.c_str())) {
      uid_ = pw->pw_uid;
      gid_ = pw->pw_gid;
    } else {
      ok_ = false;
    }
  }
  ~TestUser() {
    if (!ok_) return;
    Child del({"/usr/sbin/userdel", name_});
    del.wait(seconds(20));
  }
  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }
  uid_t uid() const { return uid_; }
  gid_t gid() const { return gid_; }
  // `argv` run as this user.
  std::vector<std::string> as(std::vector<std::string> argv) const {
    std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=" + name_, "--regid=" + name_,
                                    "--init-groups"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

 private:
  std::string name_;
  bool ok_ = false;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
};

class FileOwnerTest : public ExampleProgramTest {};

TEST_F(FileOwnerTest, ConsumerRefusesSidecarsOfAnotherUserBeforeConnecting) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create two users (useradd)";
  TestUser svc("mi_svc_"), op("mi_op_");
  if (!svc.ok() || !op.ok()) GTEST_SKIP() << "useradd failed: cannot create test users here";

  // The service user's folder and database; the operator may write the folder too (a
  // shared group in real life), which is what lets its tools create files there.
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);
  { auto inbox = open_ledger_inbox(db_); }
  for (const std::string& f : {db_, db_ + ".lock"})
    ASSERT_EQ(::chown(f.c_str(), svc.uid(), svc.gid()), 0);
  ::unlink((db_ + "-wal").c_str());
  ::unlink((db_ + "-shm").c_str());

  // The admin tool, run by the operator, refuses before it creates anything and says
  // how to run it (exit 4: refused by a safety rule).
  for (const char* cmd : {"stats", "check"}) {
    Child tool(op.as({built_program("mqtt-inbox"), cmd, db_}), dir_.file("tool.log"));
    const int ts = tool.wait(seconds(30));
    EXPECT_TRUE(WIFEXITED(ts) && WEXITSTATUS(ts) == 4) << cmd << ": status " << ts << "\n"
                                                       << read_text(dir_.file("tool.log"));
    EXPECT_NE(read_text(dir_.file("tool.log")).find("sudo -u " + svc.name()), std::string::npos)
        << read_text(dir_.file("tool.log"));
    EXPECT_NE(::access((db_ + "-shm").c_str(), F_OK), 0) << cmd << " left a -shm behind";
    EXPECT_NE(::access((db_ + "-wal").c_str(), F_OK), 0) << cmd << " left a -wal behind";
  }
  // As root it runs, and what SQLite creates belongs to the database's owner.
  {
    Child tool({built_program("mqtt-inbox"), "stats", db_}, dir_.file("root-tool.log"));
    EXPECT_EQ(tool.wait(seconds(30)), 0) << read_text(dir_.file("root-tool.log"));
    struct stat st {};
    for (const std::string& f : {db_ + "-wal", db_ + "-shm"})
      if (::stat(f.c_str(), &st) == 0) {
        EXPECT_EQ(st.st_uid, svc.uid()) << f;
      }
  }

  // The operator reads the database with sqlite3 while the consumer is stopped.
  Child peek(op.as({"/usr/bin/sqlite3", db_, "SELECT count(*) FROM inbox_meta;"}),
             dir_.file("peek.log"));
  ASSERT_EQ(peek.wait(seconds(20)), 0) << read_text(dir_.file("peek.log"));
  struct stat st {};
  ASSERT_EQ(::stat((db_ + "-shm").c_str(), &st), 0) << "sqlite3 left no -shm behind";
  ASSERT_EQ(st.st_uid, op.uid());

  // The consumer as the service user refuses, names the file and the owner, exits 6,
  // and never connects.
  const std::vector<std::string> argv = ledger_argv();
  Child refused(svc.as(argv), dir_.file("refused.log"));
  const int rc = refused.wait(seconds(30));
  const std::string log = read_text(dir_.file("refused.log"));
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 6) << "status " << rc << "\n" << log;
  EXPECT_NE(log.find(op.name()), std::string::npos) << "the owner is not named:\n" << log;
  EXPECT_NE(log.find(db_ + "-"), std::string::npos) << "the file is not named:\n" << log;
  EXPECT_NE(log.find("chown"), std::string::npos) << "the fix is not named:\n" << log;
  EXPECT_EQ(broker_connections(), 0u);

  // With the owner fixed it starts and connects.
  for (const std::string& f : {db_ + "-wal", db_ + "-shm"})
    (void)::chown(f.c_str(), svc.uid(), svc.gid());
  Child started(svc.as(argv), dir_.file("started.log"));
  EXPECT_TRUE(wait_until([&] { return broker_connections() == 1; }, seconds(20)))
      << read_text(dir_.file("started.log"));
  started.signal(SIGTERM);
  const int st2 = started.wait(seconds(20));
  EXPECT_TRUE(WIFEXITED(st2) && WEXITSTATUS(st2) == 0) << st2 << "\n"
                                                       << read_text(dir_.file("started.log"));
}

}  // namespace
}  // namespace mqtt_inbox::test
