// Text that leaves the agent for a reader that expects UTF-8: JSON (status.json, the status page,
// the event log, the records agents publish in the store, `dist-launch status --json`),
// Prometheus labels, the agent's own log lines. What it says comes from users and workers (a
// script's name, a run id, a host, an error message, a stack) and may be any bytes: what is not
// UTF-8 is replaced, never refused, so that no name can make a dump throw (nlohmann's dump()
// throws type_error 316 on invalid UTF-8) and no reader chokes on it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dist::agent {

// Whether `text` is well-formed UTF-8 (Unicode's table 3-7: no overlong forms, no surrogates,
// nothing above U+10FFFF).
bool is_valid_utf8(std::string_view text);

// `text` with each ill-formed sequence replaced by U+FFFD, one per maximal ill-formed subpart (as
// Unicode recommends, and as browsers decode): "caf\xe9.py" becomes "caf\uFFFD.py".
std::string valid_utf8(std::string_view text);

// At most `bytes` of `text`, cut before a UTF-8 character's continuation bytes (never inside a
// character).
std::string_view utf8_prefix(std::string_view text, std::size_t bytes);

// j.dump() with what is not UTF-8 in its strings replaced by U+FFFD: never throws.
std::string json_text(const nlohmann::json& j);
std::string json_text(const nlohmann::ordered_json& j);

// JSON text from elsewhere (a worker's error file) made readable by nlohmann's parser, which
// refuses what Python's json.dump writes for a name that is not UTF-8: a lone surrogate escape
// ("\udce9", from surrogateescape) becomes "\ufffd", and invalid bytes become U+FFFD.
std::string lenient_json(std::string_view text);

}  // namespace dist::agent
