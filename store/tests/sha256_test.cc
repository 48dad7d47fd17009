// The store's own SHA-256 and HMAC-SHA256 (src/sha256.h) against the published test vectors
// (FIPS 180-2's examples, RFC 4231's HMAC cases), and against OpenSSL on inputs of every length
// around the block and padding boundaries.
#include "sha256.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <random>
#include <string>

namespace dist::store::crypto {
namespace {

std::string hex(const Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : d) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

std::string bytes(std::size_t n, unsigned char value) {
  return std::string(n, static_cast<char>(value));
}

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(a);
  EXPECT_EQ(hex(million.finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HmacSha256, Rfc4231Cases) {
  struct Case {
    std::string key, data, mac;
  };
  const Case cases[] = {
      {bytes(20, 0x0b), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {bytes(20, 0xaa), bytes(50, 0xdd),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15"
       "\x16\x17\x18\x19",
       bytes(50, 0xcd), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      // A key longer than a block is hashed first.
      {bytes(131, 0xaa), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {bytes(131, 0xaa),
       "This is a test using a larger than block-size key and a larger than block-size data. "
       "The key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const auto& c : cases) EXPECT_EQ(hex(hmac_sha256(c.key, c.data)), c.mac) << c.data;
}

TEST(HmacSha256, AgreesWithOpenSslAcrossBlockBoundaries) {
  std::mt19937 random(7);
  for (std::size_t size = 0; size < 300; ++size) {
    std::string key(size % 97, '\0'), data(size, '\0');
    for (auto& c : key) c = static_cast<char>(random());
    for (auto& c : data) c = static_cast<char>(random());
    Digest expected{};
    unsigned int length = 0;
    ASSERT_NE(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                   reinterpret_cast<const unsigned char*>(data.data()), data.size(),
                   expected.data(), &length),
              nullptr);
    EXPECT_EQ(hex(hmac_sha256(key, data)), hex(expected)) << "size " << size;
    // Fed in two pieces, split anywhere, the digest is the same.
    Sha256 split;
    split.update(std::string_view(data).substr(0, size / 3));
    split.update(std::string_view(data).substr(size / 3));
    EXPECT_EQ(hex(split.finish()), hex(sha256(data))) << "size " << size;
  }
}

TEST(RandomBytes, FillsTheBufferAndDiffersBetweenCalls) {
  std::array<unsigned char, 64> a{}, b{};
  random_bytes(a);
  random_bytes(b);
  EXPECT_NE(a, b);
  EXPECT_TRUE(equal_in_constant_time(a.data(), a.data(), a.size()));
  EXPECT_FALSE(equal_in_constant_time(a.data(), b.data(), a.size()));
}

}  // namespace
}  // namespace dist::store::crypto
