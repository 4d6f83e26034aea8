// Compiled by the json_abi_mismatch_refused test with another nlohmann-json configuration
// (JSON_DIAGNOSTICS=1) than the library's: message.h must refuse it (its static_assert),
// because a Delivery's payload_json would then be read with the wrong layout.
#include <mqtt_inbox/message.h>

int main() { return 0; }
