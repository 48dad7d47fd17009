// Text that goes into log lines and error messages. Keys and values come from the network, so
// they are escaped before they are printed: a newline or an ESC in a key must not forge a log line
// or drive a terminal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dist::store {

// The key in single quotes, printable ASCII kept, everything else (control bytes, DEL, bytes of
// 0x80 and up, the backslash and the quote) as \xNN; longer than max_bytes: cut, with the length.
std::string quote_key(std::string_view key, std::size_t max_bytes = 96);

// 5703 -> "5,703": counts in warnings a person reads.
std::string group_digits(std::uint64_t n);

// A client's error for a connection the server closed at the handshake (HELLO): a plain PyTorch
// TCPStore does so, and so does a store of ours that refuses the connection at a limit.
std::string closed_at_handshake(const std::string& endpoint, const std::string& what);

// A client's error for a refused connection it takes as final (ClientOptions::refusal_is_final).
std::string refused_for_good(const std::string& endpoint);

}  // namespace dist::store
