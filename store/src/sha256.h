// SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104), random bytes from the kernel (getrandom(2)) and a
// constant-time comparison: all the store's authentication needs (auth.h, token.h). The store's
// own, not OpenSSL's: a program linked with OpenSSL pays for it at every start (relocating its
// tables: about 0.4 ms), and dist-launch needs no more of it than this (etcd's TLS loads it when
// used: etcd/lazy_openssl.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace dist::store::crypto {

using Digest = std::array<unsigned char, 32>;

class Sha256 {
 public:
  Sha256();
  void update(std::span<const unsigned char> bytes);
  void update(std::string_view text);
  Digest finish();  // the object is spent afterwards

 private:
  void block(const unsigned char* data);
  std::array<std::uint32_t, 8> state_;
  std::array<unsigned char, 64> pending_{};
  std::size_t pending_size_ = 0;
  std::uint64_t total_bytes_ = 0;
};

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);

// Fills `out` from the kernel's random pool (blocking only before the pool is first seeded).
// Throws std::system_error when the kernel refuses.
void random_bytes(std::span<unsigned char> out);

// Whether the n bytes at a and b are equal, in a time that does not depend on where they differ.
bool equal_in_constant_time(const unsigned char* a, const unsigned char* b, std::size_t n);

}  // namespace dist::store::crypto
