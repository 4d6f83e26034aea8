// libFuzzer target: the ledger example's JSON credit decoding inside a real (in-memory)
// SQLite transaction. Bad input must end as UndecodablePayload, nothing else.
#include <SQLiteCpp/SQLiteCpp.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ledger.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static SQLite::Database db(":memory:", SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  static const bool ready = [] {
    ledger::create_tables(db);
    return true;
  }();
  (void)ready;
  mqtt_inbox::Message m;
  m.topic = "fuzz";
  m.payload.assign(reinterpret_cast<const char*>(data), size);
  const std::string id = "fuzz-id";
  db.exec("BEGIN");
  try {
    ledger::apply_credit(db, mqtt_inbox::Delivery{m, id, 1});
  } catch (const mqtt_inbox::UndecodablePayload&) {
  } catch (const SQLite::Exception& e) {
    // Integer overflow of a balance is the only SQL error a credit can cause.
    if (std::string(e.what()).find("overflow") == std::string::npos) std::abort();
  }
  db.exec("ROLLBACK");
  return 0;
}
