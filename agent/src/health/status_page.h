// The status page the agent serves at --metrics-port (telemetry.h): one self-contained HTML page,
// no framework and nothing fetched from elsewhere (inline CSS and JavaScript, SVG drawn by hand).
// It starts from the status it is served with and then polls status.json (relative to itself)
// every second: this node's workers, their step times over the last ten minutes, a timeline of
// rounds, restarts and hangs. <body data-polls="N"> counts the answers it has merged.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dist::agent {

// The page, with `initial` (what /status.json answers) inside it.
std::string status_page(const nlohmann::ordered_json& initial);

}  // namespace dist::agent
