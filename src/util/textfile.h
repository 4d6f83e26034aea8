// Internal: a metrics text file replaced atomically, as node_exporter's textfile collector
// needs (it may read at any moment, so never a half-written file). Used by the Pruner's
// inbox figures and the Relay's.
#pragma once

#include <string>

namespace mqtt_inbox::detail {

// Writes `text` to "<path>.tmp", then rename(2)s it over `path`. false: nothing replaced,
// *error says which step failed and on which file.
bool write_textfile(const std::string& path, const std::string& text, std::string* error);

}  // namespace mqtt_inbox::detail
