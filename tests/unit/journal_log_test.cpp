// The service logger (journal_log.h): journal detection by JOURNAL_STREAM, the journal's
// native protocol with priorities and the per-message fields, and the stderr fallbacks.
//
// The journal side needs no journald: a child process enters a private mount namespace,
// mounts a fresh tmpfs on /run and binds /run/systemd/journal/socket itself, where
// libsystemd's sd_journal_sendv sends (journald's native protocol, systemd.journal-fields
// (7)). It runs a real Consumer whose handler fails, so the lines come from the library's
// own message path, and writes what arrived to a file for the test to check. Where the
// test may not create a mount namespace (no CAP_SYS_ADMIN) that test is skipped, saying
// so; the rest runs everywhere.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>

#include <mqtt_inbox/journal_log.h>
#include <mqtt_inbox/service_notifier.h>

#include "support/ledger_fixture.h"

namespace mqtt_inbox::test {
namespace {

using Entry = std::map<std::string, std::string>;

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string dev_ino(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return "";
  return std::to_string(static_cast<uintmax_t>(st.st_dev)) + ":" +
         std::to_string(static_cast<uintmax_t>(st.st_ino));
}

// Points fd 2 at `path` for the lifetime of the object.
class StderrTo {
 public:
  explicit StderrTo(const std::string& path) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrTo() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }

 private:
  int saved_ = -1;
};

// One journal native-protocol datagram: "FIELD=value\n", or for values holding a newline
// "FIELD\n" + 64-bit little-endian length + value + "\n".
Entry parse_entry(const std::string& d) {
  Entry e;
  size_t i = 0;
  while (i < d.size()) {
    const size_t nl = d.find('\n', i);
    const size_t eq = d.find('=', i);
    if (eq != std::string::npos && (nl == std::string::npos || eq < nl)) {
      const size_t end = nl == std::string::npos ? d.size() : nl;
      e[d.substr(i, eq - i)] = d.substr(eq + 1, end - eq - 1);
      i = end + 1;
    } else {
      const std::string name = d.substr(i, nl - i);
      uint64_t len = 0;
      for (int b = 7; b >= 0; --b) len = (len << 8) | static_cast<unsigned char>(d[nl + 1 + b]);
      e[name] = d.substr(nl + 9, len);
      i = nl + 9 + len + 1;
    }
  }
  return e;
}

// Serialises entries one field per line (newlines in values as \n), "--" between entries.
std::string serialise(const std::vector<Entry>& entries) {
  std::string out;
  for (const auto& e : entries) {
    for (const auto& [k, v] : e) {
      std::string esc;
      for (char c : v) esc += c == '\n' ? std::string("\\n") : std::string(1, c);
      out += k + "=" + esc + "\n";
    }
    out += "--\n";
  }
  return out;
}

std::vector<Entry> deserialise(const std::string& text) {
  std::vector<Entry> entries(1);
  size_t i = 0;
  while (i < text.size()) {
    const size_t nl = text.find('\n', i);
    const std::string line = text.substr(i, nl - i);
    i = nl + 1;
    if (line == "--") {
      entries.emplace_back();
      continue;
    }
    const size_t eq = line.find('=');
    std::string v;
    for (size_t k = eq + 1; k < line.size(); ++k) {
      if (line[k] == '\\' && k + 1 < line.size() && line[k + 1] == 'n') {
        v += '\n';
        ++k;
      } else {
        v += line[k];
      }
    }
    entries.back()[line.substr(0, eq)] = v;
  }
  entries.pop_back();
  return entries;
}

// The child: journald's socket in a private /run, a service logger on a journal stderr,
// a Consumer whose handler fails. Exit 77: no mount namespace allowed here.
[[noreturn]] void journal_child(const std::string& dir) {
  if (::unshare(CLONE_NEWNS) != 0) ::_exit(77);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(77);
  if (::mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") != 0) ::_exit(77);
  ::mkdir("/run/systemd", 0755);
  ::mkdir("/run/systemd/journal", 0755);
  const int sock = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, "/run/systemd/journal/socket");
  if (::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(3);

  // stderr is "the journal stream": JOURNAL_STREAM names it, as systemd would.
  const int err = ::open((dir + "/stderr.txt").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  ::dup2(err, 2);
  ::close(err);
  ::setenv("JOURNAL_STREAM", dev_ino(2).c_str(), 1);

  int rc = 0;
  try {
    std::shared_ptr<spdlog::logger> log;
    ServiceLoggerOptions lo;
    lo.level = "debug";
    lo.identifier = "ledger_consumer";
    if (!make_service_logger("ledger", lo, &log).ok()) ::_exit(4);
    log->info("plain line");
    log->error("two\nlines");
    log->debug("a debug line");

    InboxOptions io;
    io.logger = log;
    std::unique_ptr<Inbox> inbox;
    if (!Inbox::open(dir + "/j.db", io, &inbox).ok()) ::_exit(5);
    ConsumerOptions co;
    co.max_attempts = 1;
    std::unique_ptr<Consumer> consumer;
    if (!Consumer::create(
             inbox.get(), "ledger",
             [](SQLite::Database&, const Delivery&) {
               throw std::runtime_error("no such account");
             },
             co, &consumer)
             .ok())
      ::_exit(6);
    if (consumer->handle(credit_message("j-1", "zed", 1)) != Outcome::kDeadLettered) rc = 7;
    log->info("after the message");

    std::vector<Entry> entries;
    for (;;) {
      pollfd p{sock, POLLIN, 0};
      if (::poll(&p, 1, 300) <= 0) break;
      char buf[65536];
      const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
      if (n <= 0) break;
      entries.push_back(parse_entry(std::string(buf, static_cast<size_t>(n))));
    }
    std::ofstream(dir + "/entries.txt") << serialise(entries);

    // Without journald's socket, a logger made now writes "<N>" lines to the stream.
    ::close(sock);
    ::unlink("/run/systemd/journal/socket");
    std::shared_ptr<spdlog::logger> stream_log;
    if (!make_service_logger("ledger", lo, &stream_log).ok()) ::_exit(9);
    stream_log->warn("without the journal socket");
    stream_log->flush();
  } catch (...) {
    rc = 8;
  }
  ::_exit(rc);
}

TEST(JournalLog, JournalEntriesCarryPriorityIdentifierAndMessageFields) {
  TempDir dir;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) journal_child(dir.path());
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77)
    GTEST_SKIP() << "no private mount namespace allowed here (needs CAP_SYS_ADMIN)";
  ASSERT_EQ(WEXITSTATUS(status), 0) << file_text(dir.file("stderr.txt"));
  const std::string err = file_text(dir.file("stderr.txt"));
  const std::vector<Entry> entries = deserialise(file_text(dir.file("entries.txt")));

  if (!ServiceNotifier::supported()) {
    // Without libsystemd: "<N>" lines on stderr, which journald turns into priorities.
    EXPECT_TRUE(entries.empty());
    EXPECT_NE(err.find("<6>plain line\n"), std::string::npos) << err;
    EXPECT_NE(err.find("<7>a debug line\n"), std::string::npos) << err;
    EXPECT_NE(err.find("<4>consumer 'ledger': handler failed on message 'j-1'"), std::string::npos)
        << err;
    return;
  }

  auto find = [&](const std::string& fragment) -> const Entry* {
    for (const auto& e : entries)
      if (e.count("MESSAGE") && e.at("MESSAGE").find(fragment) != std::string::npos) return &e;
    return nullptr;
  };
  const std::string all = serialise(entries);
  const Entry* plain = find("plain line");
  ASSERT_NE(plain, nullptr) << all;
  EXPECT_EQ(plain->at("MESSAGE"), "plain line");  // no time stamp, no level: the journal has them
  EXPECT_EQ(plain->at("PRIORITY"), "6");
  EXPECT_EQ(plain->at("SYSLOG_IDENTIFIER"), "ledger_consumer");
  EXPECT_EQ(plain->count("CONSUMER"), 0u);
  EXPECT_EQ(plain->count("INBOX_MESSAGE_ID"), 0u);

  const Entry* two = find("two");
  ASSERT_NE(two, nullptr) << all;
  EXPECT_EQ(two->at("MESSAGE"), "two\nlines");  // one entry, newline kept
  EXPECT_EQ(two->at("PRIORITY"), "3");
  const Entry* debug = find("a debug line");
  ASSERT_NE(debug, nullptr) << all;
  EXPECT_EQ(debug->at("PRIORITY"), "7");

  // Lines the library logs while it handles a message carry the consumer and the id.
  const Entry* failed = find("handler failed on message 'j-1'");
  ASSERT_NE(failed, nullptr) << all;
  EXPECT_EQ(failed->at("PRIORITY"), "4");
  EXPECT_EQ(failed->at("CONSUMER"), "ledger");
  EXPECT_EQ(failed->at("INBOX_MESSAGE_ID"), "j-1");
  EXPECT_EQ(failed->count("MESSAGE_ID"), 0u);  // journald's catalog field is left alone
  const Entry* dead = find("dead-lettered message 'j-1'");
  ASSERT_NE(dead, nullptr) << all;
  EXPECT_EQ(dead->at("CONSUMER"), "ledger");
  EXPECT_EQ(dead->at("INBOX_MESSAGE_ID"), "j-1");
  // After the message the fields are gone again.
  const Entry* after = find("after the message");
  ASSERT_NE(after, nullptr) << all;
  EXPECT_EQ(after->count("CONSUMER"), 0u);

  // Nothing went to stderr while journald listened; without its socket, "<N>" lines did.
  EXPECT_EQ(err.find("plain line"), std::string::npos) << err;
  EXPECT_NE(err.find("<4>without the journal socket\n"), std::string::npos) << err;
}

TEST(JournalLog, StderrIsJournalOnlyForTheStreamJournalStreamNames) {
  TempDir dir;
  const std::string a = dir.file("a.txt"), b = dir.file("b.txt");
  {
    StderrTo to(a);
    const std::string id = dev_ino(2);
    ::setenv("JOURNAL_STREAM", id.c_str(), 1);
    EXPECT_TRUE(stderr_is_journal()) << id;
    const std::string dev = id.substr(0, id.find(':'));
    const std::string ino = id.substr(id.find(':') + 1);
    ::setenv("JOURNAL_STREAM", (dev + ":" + std::to_string(std::stoull(ino) + 1)).c_str(), 1);
    EXPECT_FALSE(stderr_is_journal());
    for (const char* bad : {"", "abc", "1", "1:", ":2", "1:2:3", "-1:2", "1:2x"}) {
      ::setenv("JOURNAL_STREAM", bad, 1);
      EXPECT_FALSE(stderr_is_journal()) << "'" << bad << "'";
    }
    ::setenv("JOURNAL_STREAM", id.c_str(), 1);
    {
      // A child of the service that sent its stderr elsewhere inherits JOURNAL_STREAM.
      StderrTo elsewhere(b);
      EXPECT_FALSE(stderr_is_journal());
    }
    EXPECT_TRUE(stderr_is_journal());
    ::unsetenv("JOURNAL_STREAM");
    EXPECT_FALSE(stderr_is_journal());
  }
}

// Not the journal: spdlog's default pattern on stderr, as before.
TEST(JournalLog, OutsideTheJournalLinesGoToStderrWithTimeAndLevel) {
  TempDir dir;
  ::unsetenv("JOURNAL_STREAM");
  {
    StderrTo to(dir.file("err.txt"));
    std::shared_ptr<spdlog::logger> log;
    ASSERT_TRUE(make_service_logger("ledger", {"warn", ""}, &log).ok());
    log->info("not shown");
    log->warn("shown");
    log->flush();
  }
  const std::string err = file_text(dir.file("err.txt"));
  EXPECT_NE(err.find("[ledger] [warning] shown"), std::string::npos) << err;
  EXPECT_EQ(err.find("not shown"), std::string::npos) << err;
  EXPECT_EQ(spdlog::get("ledger"), nullptr);  // not registered: a second one may be made
}

TEST(JournalLog, RefusesUnknownLevelsAndEmptyNames) {
  std::shared_ptr<spdlog::logger> log;
  EXPECT_EQ(make_service_logger("x", {"verbose", ""}, &log).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(make_service_logger("", {}, &log).code(), Status::Code::kInvalidArgument);
  for (const char* level :
       {"trace", "debug", "info", "warn", "warning", "error", "err", "critical", "off"})
    EXPECT_TRUE(make_service_logger("x", {level, ""}, &log).ok()) << level;
  EXPECT_EQ(log->level(), spdlog::level::off);
}

}  // namespace
}  // namespace mqtt_inbox::test
