#include "auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

namespace dist::rendezvous::auth {
namespace {

Mac proof(std::string_view label, std::string_view secret, const Nonce& server_nonce,
          const Nonce& client_nonce) {
  std::string message(label);
  message.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  message.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  Mac mac{};
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(),
            &length) ||
      length != mac.size()) {
    throw std::runtime_error("HMAC-SHA256 failed in OpenSSL");
  }
  return mac;
}

}  // namespace

Nonce random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw std::runtime_error("OpenSSL could not produce random bytes for an auth nonce");
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
  return CRYPTO_memcmp(a, b, n) == 0;
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

}  // namespace dist::rendezvous::auth
