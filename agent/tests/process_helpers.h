// Process checks shared by the agent's tests.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace dist::agent::testing {

// True once `pid` has exited within `timeout`. A zombie counts as gone: it runs nothing, and an
// orphan's zombie waits for whoever reaps orphans here.
inline bool process_gone(pid_t pid,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  do {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string content;
    if (!stat || !std::getline(stat, content)) return true;
    const auto close = content.rfind(')');
    if (close != std::string::npos && content.size() > close + 2 && content[close + 2] == 'Z') {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < end);
  return false;
}

}  // namespace dist::agent::testing
