// OpenSSL for etcd's TLS, loaded when a connection first uses it. dist-launch links no OpenSSL:
// linked statically it cost every start about 0.4 ms (relocating its 360 KB of pointer tables,
// its CPU probing), for a feature most jobs never use; linked dynamically it would cost loading
// two libraries. Instead each function that Asio's TLS stream and etcd/connection.cc call is
// defined here: the first call of any loads the system's libssl.so.3 (OpenSSL 3, whose ABI the
// headers this builds against describe), looks up every function of the list at once, and calls
// through. A process without TLS never loads it.
//
// The first call is always C++ (the TLS context's constructor, in etcd/client.cc's make_tls):
// a failure to load is a StoreError there, at the client's creation. Later calls, some of them
// made from inside OpenSSL (the certificate check's callback), cannot fail: every function was
// found at the first.
//
// The list is every OpenSSL function the dist_etcd library references (`nm -u` of its objects);
// a new one fails to link ("undefined reference"), and belongs here. Each definition matches the
// header's declaration, which the compiler checks.
#include <dlfcn.h>
#include <openssl/dh.h>
#include <openssl/err.h>
#include <openssl/opensslv.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <array>
#include <string>

#include "dist/store/errors.h"

#if OPENSSL_VERSION_MAJOR != 3
#error "lazy_openssl.cc loads libssl.so.3: build against OpenSSL 3's headers"
#endif

// X(library, result, name, parameters, arguments) for every function.
#define DIST_OPENSSL_FUNCTIONS(X)                                                                  \
  X(kCrypto, long, BIO_ctrl, (BIO * bp, int cmd, long larg, void* parg), (bp, cmd, larg, parg))    \
  X(kCrypto, size_t, BIO_ctrl_pending, (BIO * b), (b))                                             \
  X(kCrypto, int, BIO_free, (BIO * a), (a))                                                        \
  X(kCrypto, int, BIO_new_bio_pair,                                                                \
    (BIO * *bio1, size_t writebuf1, BIO * *bio2, size_t writebuf2),                                \
    (bio1, writebuf1, bio2, writebuf2))                                                            \
  X(kCrypto, BIO*, BIO_new_file, (const char* filename, const char* mode), (filename, mode))       \
  X(kCrypto, BIO*, BIO_new_mem_buf, (const void* buf, int len), (buf, len))                        \
  X(kCrypto, int, BIO_read, (BIO * b, void* data, int dlen), (b, data, dlen))                      \
  X(kCrypto, int, BIO_write, (BIO * b, const void* data, int dlen), (b, data, dlen))               \
  X(kCrypto, void, CRYPTO_free, (void* ptr, const char* file, int line), (ptr, file, line))        \
  X(kCrypto, void, DH_free, (DH * dh), (dh))                                                       \
  X(kCrypto, void, ERR_clear_error, (), ())                                                        \
  X(kCrypto, unsigned long, ERR_get_error, (), ())                                                 \
  X(kCrypto, unsigned long, ERR_peek_error, (), ())                                                \
  X(kCrypto, unsigned long, ERR_peek_last_error, (), ())                                           \
  X(kCrypto, const char*, ERR_reason_error_string, (unsigned long e), (e))                         \
  X(kCrypto, void, EVP_PKEY_free, (EVP_PKEY * pkey), (pkey))                                       \
  X(kCrypto, DH*, PEM_read_bio_DHparams, (BIO * out, DH * *x, pem_password_cb * cb, void* u),      \
    (out, x, cb, u))                                                                               \
  X(kCrypto, EVP_PKEY*, PEM_read_bio_PrivateKey,                                                   \
    (BIO * out, EVP_PKEY * *x, pem_password_cb * cb, void* u), (out, x, cb, u))                    \
  X(kCrypto, RSA*, PEM_read_bio_RSAPrivateKey,                                                     \
    (BIO * out, RSA * *x, pem_password_cb * cb, void* u), (out, x, cb, u))                         \
  X(kCrypto, X509*, PEM_read_bio_X509, (BIO * out, X509 * *x, pem_password_cb * cb, void* u),      \
    (out, x, cb, u))                                                                               \
  X(kCrypto, X509*, PEM_read_bio_X509_AUX, (BIO * out, X509 * *x, pem_password_cb * cb, void* u),  \
    (out, x, cb, u))                                                                               \
  X(kCrypto, void, RSA_free, (RSA * r), (r))                                                       \
  X(kSsl, uint64_t, SSL_CTX_clear_options, (SSL_CTX * ctx, uint64_t op), (ctx, op))                \
  X(kSsl, long, SSL_CTX_ctrl, (SSL_CTX * ctx, int cmd, long larg, void* parg),                     \
    (ctx, cmd, larg, parg))                                                                        \
  X(kSsl, void, SSL_CTX_free, (SSL_CTX * a0), (a0))                                                \
  X(kSsl, X509_STORE*, SSL_CTX_get_cert_store, (const SSL_CTX* a0), (a0))                          \
  X(kSsl, pem_password_cb*, SSL_CTX_get_default_passwd_cb, (SSL_CTX * ctx), (ctx))                 \
  X(kSsl, void*, SSL_CTX_get_default_passwd_cb_userdata, (SSL_CTX * ctx), (ctx))                   \
  X(kSsl, void*, SSL_CTX_get_ex_data, (const SSL_CTX* ssl, int idx), (ssl, idx))                   \
  X(kSsl, SSL_verify_cb, SSL_CTX_get_verify_callback, (const SSL_CTX* ctx), (ctx))                 \
  X(kSsl, int, SSL_CTX_get_verify_mode, (const SSL_CTX* ctx), (ctx))                               \
  X(kSsl, int, SSL_CTX_load_verify_locations,                                                      \
    (SSL_CTX * ctx, const char* CAfile, const char* CApath), (ctx, CAfile, CApath))                \
  X(kSsl, SSL_CTX*, SSL_CTX_new, (const SSL_METHOD* meth), (meth))                                 \
  X(kSsl, void, SSL_CTX_set_default_passwd_cb, (SSL_CTX * ctx, pem_password_cb * cb), (ctx, cb))   \
  X(kSsl, void, SSL_CTX_set_default_passwd_cb_userdata, (SSL_CTX * ctx, void* u), (ctx, u))        \
  X(kSsl, int, SSL_CTX_set_default_verify_paths, (SSL_CTX * ctx), (ctx))                           \
  X(kSsl, int, SSL_CTX_set_ex_data, (SSL_CTX * ssl, int idx, void* data), (ssl, idx, data))        \
  X(kSsl, uint64_t, SSL_CTX_set_options, (SSL_CTX * ctx, uint64_t op), (ctx, op))                  \
  X(kSsl, void, SSL_CTX_set_verify, (SSL_CTX * ctx, int mode, SSL_verify_cb callback),             \
    (ctx, mode, callback))                                                                         \
  X(kSsl, void, SSL_CTX_set_verify_depth, (SSL_CTX * ctx, int depth), (ctx, depth))                \
  X(kSsl, int, SSL_CTX_use_PrivateKey, (SSL_CTX * ctx, EVP_PKEY * pkey), (ctx, pkey))              \
  X(kSsl, int, SSL_CTX_use_PrivateKey_file, (SSL_CTX * ctx, const char* file, int type),           \
    (ctx, file, type))                                                                             \
  X(kSsl, int, SSL_CTX_use_RSAPrivateKey, (SSL_CTX * ctx, RSA * rsa), (ctx, rsa))                  \
  X(kSsl, int, SSL_CTX_use_RSAPrivateKey_file, (SSL_CTX * ctx, const char* file, int type),        \
    (ctx, file, type))                                                                             \
  X(kSsl, int, SSL_CTX_use_certificate, (SSL_CTX * ctx, X509 * x), (ctx, x))                       \
  X(kSsl, int, SSL_CTX_use_certificate_ASN1, (SSL_CTX * ctx, int len, const unsigned char* d),     \
    (ctx, len, d))                                                                                 \
  X(kSsl, int, SSL_CTX_use_certificate_chain_file, (SSL_CTX * ctx, const char* file), (ctx, file)) \
  X(kSsl, int, SSL_CTX_use_certificate_file, (SSL_CTX * ctx, const char* file, int type),          \
    (ctx, file, type))                                                                             \
  X(kSsl, int, SSL_accept, (SSL * ssl), (ssl))                                                     \
  X(kSsl, int, SSL_connect, (SSL * ssl), (ssl))                                                    \
  X(kSsl, long, SSL_ctrl, (SSL * ssl, int cmd, long larg, void* parg), (ssl, cmd, larg, parg))     \
  X(kSsl, void, SSL_free, (SSL * ssl), (ssl))                                                      \
  X(kSsl, SSL_CTX*, SSL_get_SSL_CTX, (const SSL* ssl), (ssl))                                      \
  X(kSsl, int, SSL_get_error, (const SSL* s, int ret_code), (s, ret_code))                         \
  X(kSsl, void*, SSL_get_ex_data, (const SSL* ssl, int idx), (ssl, idx))                           \
  X(kSsl, int, SSL_get_ex_data_X509_STORE_CTX_idx, (), ())                                         \
  X(kSsl, int, SSL_get_shutdown, (const SSL* ssl), (ssl))                                          \
  X(kSsl, SSL_verify_cb, SSL_get_verify_callback, (const SSL* s), (s))                             \
  X(kSsl, int, SSL_get_verify_mode, (const SSL* s), (s))                                           \
  X(kSsl, SSL*, SSL_new, (SSL_CTX * ctx), (ctx))                                                   \
  X(kSsl, int, SSL_read, (SSL * ssl, void* buf, int num), (ssl, buf, num))                         \
  X(kSsl, void, SSL_set_bio, (SSL * s, BIO * rbio, BIO * wbio), (s, rbio, wbio))                   \
  X(kSsl, int, SSL_set_ex_data, (SSL * ssl, int idx, void* data), (ssl, idx, data))                \
  X(kSsl, void, SSL_set_verify, (SSL * s, int mode, SSL_verify_cb callback), (s, mode, callback))  \
  X(kSsl, void, SSL_set_verify_depth, (SSL * s, int depth), (s, depth))                            \
  X(kSsl, int, SSL_shutdown, (SSL * s), (s))                                                       \
  X(kSsl, int, SSL_write, (SSL * ssl, const void* buf, int num), (ssl, buf, num))                  \
  X(kSsl, const SSL_METHOD*, TLS_client_method, (), ())                                            \
  X(kSsl, const SSL_METHOD*, TLS_method, (), ())                                                   \
  X(kSsl, const SSL_METHOD*, TLS_server_method, (), ())                                            \
  X(kCrypto, X509*, X509_STORE_CTX_get_current_cert, (const X509_STORE_CTX* ctx), (ctx))           \
  X(kCrypto, int, X509_STORE_CTX_get_error_depth, (const X509_STORE_CTX* ctx), (ctx))              \
  X(kCrypto, void*, X509_STORE_CTX_get_ex_data, (const X509_STORE_CTX* ctx, int idx), (ctx, idx))  \
  X(kCrypto, int, X509_STORE_add_cert, (X509_STORE * ctx, X509 * x), (ctx, x))                     \
  X(kCrypto, int, X509_check_host,                                                                 \
    (X509 * x, const char* chk, size_t chklen, unsigned int flags, char** peername),               \
    (x, chk, chklen, flags, peername))                                                             \
  X(kCrypto, int, X509_check_ip_asc, (X509 * x, const char* ipasc, unsigned int flags),            \
    (x, ipasc, flags))                                                                             \
  X(kCrypto, void, X509_free, (X509 * a), (a))                                                     \
  X(kCrypto, EVP_PKEY*, d2i_PrivateKey_bio, (BIO * bp, EVP_PKEY * *a), (bp, a))                    \
  X(kCrypto, RSA*, d2i_RSAPrivateKey_bio, (BIO * bp, RSA * *rsa), (bp, rsa))

namespace dist::store::etcd::detail {
namespace {

enum Library { kSsl, kCrypto };

enum Function : std::size_t {
#define DIST_OPENSSL_INDEX(library, result, name, parameters, arguments) k_##name,
  DIST_OPENSSL_FUNCTIONS(DIST_OPENSSL_INDEX)
#undef DIST_OPENSSL_INDEX
      kFunctionCount
};

struct Entry {
  Library library;
  const char* name;
};

constexpr std::array<Entry, kFunctionCount> kEntries = {{
#define DIST_OPENSSL_ENTRY(library, result, name, parameters, arguments) {library, #name},
    DIST_OPENSSL_FUNCTIONS(DIST_OPENSSL_ENTRY)
#undef DIST_OPENSSL_ENTRY
}};

void* load(const char* soname) {
  void* handle = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    throw StoreError(StoreErrc::kInvalidArgument,
                     std::string("etcd: TLS needs OpenSSL 3 (") + soname +
                         ", Debian's and Ubuntu's libssl3): " + (why ? why : "not found"));
  }
  return handle;
}

// Every function of the list, looked up once. Throws StoreError when OpenSSL 3 cannot be loaded
// or lacks one.
using Table = std::array<void*, kFunctionCount>;
Table look_up_all() {
  void* const ssl = load("libssl.so.3");  // which loads its libcrypto.so.3
  void* const crypto = load("libcrypto.so.3");
  Table table{};
  for (std::size_t i = 0; i < kFunctionCount; ++i) {
    table[i] = ::dlsym(kEntries[i].library == kSsl ? ssl : crypto, kEntries[i].name);
    if (!table[i]) {
      throw StoreError(StoreErrc::kInvalidArgument,
                       std::string("etcd: the system's OpenSSL 3 lacks ") + kEntries[i].name +
                           ", which dist-launch was built to call");
    }
  }
  return table;
}

void* function(Function f) {
  static const Table table = look_up_all();  // a failed look-up is tried again at the next call
  return table[f];
}

}  // namespace
}  // namespace dist::store::etcd::detail

#define DIST_OPENSSL_DEFINE(library, result, name, parameters, arguments)                    \
  extern "C" result name parameters {                                                        \
    using Real = result(*) parameters;                                                       \
    return reinterpret_cast<Real>(                                                           \
        dist::store::etcd::detail::function(dist::store::etcd::detail::k_##name)) arguments; \
  }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // DH_free, RSA_free, ...: Asio's
DIST_OPENSSL_FUNCTIONS(DIST_OPENSSL_DEFINE)
#pragma GCC diagnostic pop
