// The key functions of the public API's polymorphic types: each interface's and
// exception's destructor, defined out of line here, so that the type's vtable and type
// information are emitted once, in libmqtt_inbox_core, whatever the build's optimisation
// level. With every virtual function inline, each object file that used a type carried its
// own weak copy, and which copies the shared MQTT library kept (and exported) changed
// between a -O0 and a -O2 build (docs/c-api.md#symbols, ctest capi_exported_symbols).
#include "mqtt_inbox/clock.h"
#include "mqtt_inbox/handler.h"
#include "mqtt_inbox/message.h"
#include "mqtt_inbox/outbox.h"
#include "mqtt_inbox/session_record.h"

namespace mqtt_inbox {

Clock::~Clock() = default;
MessageSink::~MessageSink() = default;
SessionRecords::~SessionRecords() = default;
UndecodablePayload::~UndecodablePayload() = default;
RejectMessage::~RejectMessage() = default;
RetryLater::~RetryLater() = default;
OutboxRejected::~OutboxRejected() = default;
OutboxRefused::~OutboxRefused() = default;
OutboxFull::~OutboxFull() = default;

}  // namespace mqtt_inbox
