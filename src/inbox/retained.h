// The texts of the retained-message policy (RetainedPolicy, options.h), shared by the
// Consumer and the store-then-process receipt so both say the same thing.
#pragma once

#include <string>

#include "util/log.h"

namespace mqtt_inbox::detail {

// The log line for a retained message skipped under RetainedPolicy::kSkip.
inline std::string retained_skip_text(const std::string& topic) {
  return "skipped a retained message on topic '" + printable(topic) +
         "' (RETAIN=1: a stored message the broker sends because of a SUBSCRIBE, not one "
         "published to this session; ConsumerOptions::retained is skip)";
}

// The reason text of a dead letter written under RetainedPolicy::kDeadLetter.
inline const char* retained_dead_letter_text() {
  return "retained message (RETAIN=1: a stored message the broker sends because of a "
         "SUBSCRIBE, possibly published long before; ConsumerOptions::retained is "
         "dead_letter); replay it to process it";
}

}  // namespace mqtt_inbox::detail
