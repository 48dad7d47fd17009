// The programs a test starts: those built beside it (their paths are compile definitions, the
// *_BUILT below), or, when DIST_TEST_PROGRAMS names a folder, the programs of the same names
// there. scripts/sanitize.sh runs the plain build's whole-program tests against its sanitized
// programs that way: the tests' own code needs no sanitizer, and is built once.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace dist::agent::testing {

inline std::string program_path(const char* built) {
  const char* folder = std::getenv("DIST_TEST_PROGRAMS");
  if (folder == nullptr || *folder == '\0') return built;
  return (std::filesystem::path(folder) / std::filesystem::path(built).filename()).string();
}

}  // namespace dist::agent::testing

// Each one resolved once, as a C string (execv takes them too).
#define DIST_TEST_PROGRAM(built)                                                 \
  ([]() -> const char* {                                                         \
    static const std::string path = ::dist::agent::testing::program_path(built); \
    return path.c_str();                                                         \
  }())
#define DIST_LAUNCH_BIN DIST_TEST_PROGRAM(DIST_LAUNCH_BIN_BUILT)
#define DIST_TEST_WORKER_BIN DIST_TEST_PROGRAM(DIST_TEST_WORKER_BIN_BUILT)
#define DIST_WATCHDOG_WORKER_BIN DIST_TEST_PROGRAM(DIST_WATCHDOG_WORKER_BIN_BUILT)
#define DIST_INPLACE_WORKER_BIN DIST_TEST_PROGRAM(DIST_INPLACE_WORKER_BIN_BUILT)
#define DIST_RENDEZVOUS_BIN DIST_TEST_PROGRAM(DIST_RENDEZVOUS_BIN_BUILT)
