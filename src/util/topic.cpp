#include "mqtt_inbox/topic.h"

#include "util/log.h"
#include "util/text.h"

namespace mqtt_inbox {

namespace {

// MQTT strings carry a two-byte length (MQTT 3.1.1 section 1.5.3).
constexpr size_t kMaxMqttString = 65535;

// Why `text` cannot be a topic name or filter at all, or "".
std::string string_problem(const std::string& text, const std::string& what) {
  if (text.empty()) return what + " is empty";
  if (text.size() > kMaxMqttString)
    return what + " is " + std::to_string(text.size()) + " bytes, longer than MQTT's " +
           std::to_string(kMaxMqttString);
  if (!detail::is_valid_utf8(text))
    return what + " '" + detail::printable(text) + "' is not valid UTF-8";
  if (text.find('\0') != std::string::npos)
    return what + " '" + detail::printable(text) + "' holds the character U+0000";
  return "";
}

}  // namespace

Status check_topic_name(const std::string& topic, const std::string& what) {
  if (std::string why = string_problem(topic, what); !why.empty())
    return Status::InvalidArgument(why);
  if (topic.find_first_of("+#") != std::string::npos)
    return Status::InvalidArgument(what + " '" + detail::printable(topic) +
                                   "' holds a wildcard ('+' or '#'): a topic name to publish "
                                   "to cannot (MQTT 3.1.1 section 4.7.1)");
  return Status::Ok();
}

Status check_topic_filter(const std::string& filter, const std::string& what) {
  if (std::string why = string_problem(filter, what); !why.empty())
    return Status::InvalidArgument(why);
  std::string rest = filter;
  static const std::string kShare = "$share/";
  if (filter.compare(0, kShare.size(), kShare) == 0) {
    const size_t slash = filter.find('/', kShare.size());
    const std::string name = filter.substr(
        kShare.size(), slash == std::string::npos ? std::string::npos : slash - kShare.size());
    if (slash == std::string::npos || name.empty() || name.find_first_of("+#") != std::string::npos)
      return Status::InvalidArgument(what + " '" + detail::printable(filter) +
                                     "' is not $share/<name>/<filter> with a name free of "
                                     "'/', '+' and '#' (MQTT 5.0 section 4.8.2)");
    rest = filter.substr(slash + 1);
    if (rest.empty())
      return Status::InvalidArgument(what + " '" + detail::printable(filter) +
                                     "' has no filter after the share name");
  }
  size_t level_start = 0;
  for (size_t i = 0; i <= rest.size(); ++i) {
    if (i < rest.size() && rest[i] != '/') continue;
    const std::string level = rest.substr(level_start, i - level_start);
    const bool last = i == rest.size();
    if (level.find('#') != std::string::npos && (level != "#" || !last))
      return Status::InvalidArgument(what + " '" + detail::printable(filter) +
                                     "' has '#' other than as its whole last level "
                                     "(MQTT 3.1.1 section 4.7.1.2)");
    if (level.find('+') != std::string::npos && level != "+")
      return Status::InvalidArgument(what + " '" + detail::printable(filter) +
                                     "' has '+' other than as a whole level "
                                     "(MQTT 3.1.1 section 4.7.1.3)");
    level_start = i + 1;
  }
  return Status::Ok();
}

}  // namespace mqtt_inbox
