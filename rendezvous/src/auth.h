// Challenge-response authentication with a shared secret; the secret never crosses the wire.
// The server sends a random nonce in its HELLO reply; the client answers with its own nonce and
// HMAC-SHA256(secret, "dist-store/client/v1" | server_nonce | client_nonce); the server proves it
// knows the secret too with HMAC-SHA256(secret, "dist-store/server/v1" | server_nonce |
// client_nonce).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace dist::rendezvous::auth {

using Mac = std::array<unsigned char, 32>;
using Nonce = std::array<unsigned char, 32>;

Nonce random_nonce();
Mac client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
Mac server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
bool equal(const unsigned char* a, const unsigned char* b, std::size_t n);  // constant time

}  // namespace dist::rendezvous::auth
