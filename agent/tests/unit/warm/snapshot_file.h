// A snapshot file as the workers write it (docs/SNAPSHOTS.md), for the agent's tests: `header`
// (which names its save_id), the payload, and a footer with `footer_id` (0: the header's save id,
// a whole file; another: a file read while it was rewritten).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace dist::agent::warm::testing {

inline void write_snapshot_file(const std::filesystem::path& path, const nlohmann::json& header,
                                const std::string& payload, std::uint64_t footer_id = 0) {
  std::filesystem::create_directories(path.parent_path());
  const std::string text = header.dump();
  std::string bytes = "DLSNAP02";
  const std::uint64_t header_bytes = text.size();
  bytes.append(reinterpret_cast<const char*>(&header_bytes), 8);
  bytes += text + payload;
  const std::uint64_t size = bytes.size() + 24;
  const std::uint64_t id = footer_id ? footer_id : header.at("save_id").get<std::uint64_t>();
  bytes += "DLSNAPOK";
  bytes.append(reinterpret_cast<const char*>(&size), 8);
  bytes.append(reinterpret_cast<const char*>(&id), 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace dist::agent::warm::testing
