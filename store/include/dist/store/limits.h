// Size and count limits of the store. The server enforces them; the client learns the server's
// values at connect time and checks its own requests before sending them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dist::store {

struct StoreLimits {
  std::uint64_t max_key_bytes = 8 * 1024;              // one key
  std::uint64_t max_value_bytes = 8 * 1024 * 1024;     // one value
  std::uint64_t max_keys_per_request = 128 * 1024;     // CHECK, WAIT, MULTI_GET, MULTI_SET, ...
  std::uint64_t max_request_bytes = 32 * 1024 * 1024;  // one request, buffered while incomplete
  // Unsent replies before reads from that client pause: small, so that a client that does not
  // read costs little memory and little work (more than the kernel's socket buffer already).
  std::uint64_t max_reply_backlog_bytes = 1024 * 1024;
  // Everything one connection makes the server hold besides stored data: its partial request,
  // its unsent replies, its waits and watches. Over it, that connection is closed.
  std::uint64_t max_connection_bytes = 128 * 1024 * 1024;
  // Everything the server holds for its clients: keys and values (with their bookkeeping) plus
  // every connection's bytes as above. Over it, the connections holding the most are closed
  // first; a write that still does not fit is refused (store full).
  std::uint64_t max_total_bytes = 1024ull * 1024 * 1024;
  std::uint64_t max_connections = 65536;  // open client connections

  // Empty when consistent, otherwise a one-line explanation of what to fix.
  std::string validate() const;
};

// Raises this process's open-file limit to its hard limit: every client of a store, and every
// connection of a load generator, is a file descriptor. A process allowed to (root,
// CAP_SYS_RESOURCE) raises the hard limit too, to the kernel's most (/proc/sys/fs/nr_open): a
// store of 16,000 nodes holds 32,000 connections (each agent's session and its watch).
void raise_open_file_limit();

}  // namespace dist::store
