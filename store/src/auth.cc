#include "auth.h"

#include <stdexcept>
#include <system_error>

#include "sha256.h"

namespace dist::store::auth {

Mac proof(std::string_view label, std::string_view secret, const Nonce& server_nonce,
          const Nonce& client_nonce) {
  std::string message(label);
  message.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  message.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  return crypto::hmac_sha256(secret, message);
}

Nonce random_nonce() {
  Nonce nonce{};
  try {
    crypto::random_bytes(nonce);
  } catch (const std::system_error& e) {
    throw std::runtime_error(std::string("no random bytes for an auth nonce: ") + e.what());
  }
  return nonce;
}

Mac client_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return proof("dist-store/client/v1", secret, server_nonce, client_nonce);
}

Mac server_proof(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return proof("dist-store/server/v1", secret, server_nonce, client_nonce);
}

bool equal(const unsigned char* a, const unsigned char* b, std::size_t n) {
  return crypto::equal_in_constant_time(a, b, n);
}

namespace {
constexpr const char* kHowToPassIt =
    "use the job's token file everywhere: dist-launch --token-file FILE (or "
    "DIST_LAUNCH_TOKEN_FILE=FILE) on every node, dist-rendezvous --token-file FILE, dist-launch "
    "status --token-file FILE";
}

std::string token_required(const std::string& endpoint) {
  return "the store at " + endpoint +
         " requires the job's token and this client has none: " + kHowToPassIt;
}

std::string store_without_token(const std::string& endpoint) {
  return "the store at " + endpoint +
         " does not ask for the job's token, which this client has: it is not this job's store, "
         "or it was started without the token; " +
         kHowToPassIt;
}

std::string token_refused(const std::string& reply) {
  return reply + " (this client's token is not the store's: " + kHowToPassIt + ")";
}

}  // namespace dist::store::auth
