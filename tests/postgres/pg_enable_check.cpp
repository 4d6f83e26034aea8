// The PostgreSQL store as a library of its own (mqtt_inbox_postgres): until the program
// calls enable_postgres_store(), Inbox::open refuses a postgresql:// location with
// kInvalidArgument saying what to link and what to call; after it (called from several
// threads at once, and twice: it is idempotent), the location reaches the PostgreSQL store,
// whose own refusal of a password in the URI shows it (no server needed). Built against the
// static libraries and against the shared variants (tests/postgres/CMakeLists.txt).
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mqtt_inbox/inbox.h>
#include <mqtt_inbox/postgres.h>

namespace {

int failures = 0;

void check(bool ok, const std::string& what, const std::string& detail) {
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  if (!ok) ++failures;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

int main() {
  using mqtt_inbox::Inbox;
  using mqtt_inbox::InboxOptions;
  using mqtt_inbox::Status;
  const std::string with_password = "postgresql://alice:hunter2@db.invalid/ledger";

  for (const char* uri : {"postgresql:///ledger", "postgres:///x"}) {
    std::unique_ptr<Inbox> inbox;
    const Status s = Inbox::open(uri, InboxOptions{}, &inbox);
    const std::string text = s.to_string();
    check(s.code() == Status::Code::kInvalidArgument && !inbox,
          std::string("before enable_postgres_store(), ") + uri + " is refused", text);
    check(has(text, "mqtt_inbox::postgres") && has(text, "pkg-config: mqtt_inbox_postgres") &&
              has(text, "enable_postgres_store()"),
          "the refusal says what to link and call", "");
  }

  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([] { mqtt_inbox::enable_postgres_store(); });
  for (auto& t : threads) t.join();
  mqtt_inbox::enable_postgres_store();

  std::unique_ptr<Inbox> inbox;
  const Status s = Inbox::open(with_password, InboxOptions{}, &inbox);
  const std::string text = s.to_string();
  check(s.code() == Status::Code::kInvalidArgument && has(text, "holds a password") &&
            !has(text, "hunter2") && !has(text, "enable_postgres_store"),
        "after enable_postgres_store(), the PostgreSQL store is reached", text);

  return failures == 0 ? 0 : 1;
}
