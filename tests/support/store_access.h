// Test support: the store behind an Inbox, for white-box tests that reach past the public
// API (the Store front, store/store.h). Link mqtt_inbox::internal.
#pragma once

#include <mqtt_inbox/inbox.h>

#include "store/inbox.h"
#include "store/store.h"

namespace mqtt_inbox::test {

inline detail::Store& store_of(Inbox& inbox) { return *detail::InboxImpl::store_of(&inbox); }

}  // namespace mqtt_inbox::test
