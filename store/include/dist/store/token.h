// A job's token: the shared secret its agents (and C++ workers) prove to the store
// (docs/STORE.md, Authentication). It travels as a file path, never as the secret itself:
// dist-launch --token-file, dist-rendezvous --token-file, and in every worker's environment
// kTokenFileVariable. read_secret_file() (client.h) reads one.
#pragma once

#include <string>

#include "dist/contract/worker_contract.h"

namespace dist::store {

// The environment variable that names the job's token file: the agents' default for
// --token-file, and how dist-launch tells its workers (the SDK reads it; the worker contract's).
inline constexpr const char* kTokenFileVariable = worker_contract::kTokenFile;

// A new random token: 32 bytes from the system's generator, as 64 hex digits.
std::string generate_secret();

// Creates `path` (it must not exist; a symbolic link is not followed), mode 0600, holding
// `secret` and a newline, as read_secret_file reads it back. Throws StoreError(kInvalidArgument)
// naming the file when it cannot.
void write_secret_file(const std::string& path, const std::string& secret);

}  // namespace dist::store
