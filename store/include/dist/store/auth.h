// The job's shared-secret proofs, for the store and for the job's other channels between agents
// (the snapshot replicas: agent/src/warm/snapshot_replicas.h). Challenge-response: each side sends
// a random nonce and a proof is HMAC-SHA256(secret, label | server_nonce | client_nonce); the
// secret never crosses the wire. Every channel and direction has its own label, so that a proof
// made for one is worthless on another (a relay between two channels gains nothing).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace dist::store::auth {

using Mac = std::array<unsigned char, 32>;
using Nonce = std::array<unsigned char, 32>;

Nonce random_nonce();
Mac proof(std::string_view label, std::string_view secret, const Nonce& server_nonce,
          const Nonce& client_nonce);
bool equal(const unsigned char* a, const unsigned char* b, std::size_t n);  // constant time

}  // namespace dist::store::auth
