// Test support: the relay side of an Outbox (src/outbox/relay_source.h), for tests that
// read and mark outbox rows as a Relay does. Link mqtt_inbox::internal.
#pragma once

#include <mqtt_inbox/outbox.h>

#include "outbox/relay_source.h"

namespace mqtt_inbox::test {

inline detail::RelaySource& relay_side(Outbox& outbox) { return *detail::RelaySource::of(&outbox); }

}  // namespace mqtt_inbox::test
