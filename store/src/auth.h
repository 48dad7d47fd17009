// Challenge-response authentication with a shared secret; the secret never crosses the wire.
// The server sends a random nonce in its HELLO reply; the client answers with its own nonce and
// HMAC-SHA256(secret, "dist-store/client/v1" | server_nonce | client_nonce); the server proves it
// knows the secret too with HMAC-SHA256(secret, "dist-store/server/v1" | server_nonce |
// client_nonce).
#pragma once

#include <string>
#include <string_view>

#include "dist/store/auth.h"  // Mac, Nonce, random_nonce(), proof(), equal()

namespace dist::store::auth {

Mac client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
Mac server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);

// The clients' errors when a token and a store do not match, each saying what to do.
std::string token_required(const std::string& endpoint);       // the store asks, we have none
std::string store_without_token(const std::string& endpoint);  // we have one, the store asks none
std::string token_refused(const std::string& reply);  // the store's error reply to our AUTH

}  // namespace dist::store::auth
