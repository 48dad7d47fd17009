// OpenSSL for etcd's TLS, loaded when a connection first uses it. dist-launch links no OpenSSL:
// linked statically it cost every start about 0.4 ms (relocating its 360 KB of pointer tables,
// its CPU probing), for a feature most jobs never use; linked dynamically it would cost loading
// two libraries. Instead each function that Asio's TLS stream and etcd/connection.cc call is
// defined here, and the first call of any loads the system's libssl.so.3 (OpenSSL 3, whose ABI
// the headers this builds against describe) and calls through to it. A process without TLS
// never loads it.
//
// The list is every OpenSSL function the dist_etcd library references (`nm -u` of its objects);
// a new one fails to link ("undefined reference"), and belongs here. Each definition matches the
// header's declaration, which the compiler checks.
#include <dlfcn.h>
#include <openssl/dh.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <stdexcept>
#include <string>

namespace dist::rendezvous::etcd::detail {
namespace {

enum Library { kSsl, kCrypto };

void* load(const char* soname) {
  void* handle = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    throw std::runtime_error(std::string("etcd over TLS needs OpenSSL 3 (") + soname +
                             ", Debian's and Ubuntu's libssl3): " + (why ? why : "not found"));
  }
  return handle;
}

// The real function `name`. Throws when OpenSSL cannot be loaded or lacks it.
void* resolve(Library library, const char* name) {
  static void* const ssl = load("libssl.so.3");  // which loads its libcrypto.so.3
  static void* const crypto = load("libcrypto.so.3");
  void* function = ::dlsym(library == kSsl ? ssl : crypto, name);
  if (!function) {
    throw std::runtime_error(std::string("the system's OpenSSL 3 lacks ") + name +
                             ": dist-launch was built against another version's headers");
  }
  return function;
}

}  // namespace
}  // namespace dist::rendezvous::etcd::detail

#define DIST_LAZY_OPENSSL(library, result, name, parameters, arguments)                           \
  extern "C" result name parameters {                                                             \
    using Function = result(*) parameters;                                                        \
    static const auto real = reinterpret_cast<Function>(                                          \
        dist::rendezvous::etcd::detail::resolve(dist::rendezvous::etcd::detail::library, #name)); \
    return real arguments;                                                                        \
  }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // DH_free, RSA_free, ...: Asio's
DIST_LAZY_OPENSSL(kCrypto, long, BIO_ctrl, (BIO * bp, int cmd, long larg, void* parg),
                  (bp, cmd, larg, parg))
DIST_LAZY_OPENSSL(kCrypto, size_t, BIO_ctrl_pending, (BIO * b), (b))
DIST_LAZY_OPENSSL(kCrypto, int, BIO_free, (BIO * a), (a))
DIST_LAZY_OPENSSL(kCrypto, int, BIO_new_bio_pair,
                  (BIO * *bio1, size_t writebuf1, BIO** bio2, size_t writebuf2),
                  (bio1, writebuf1, bio2, writebuf2))
DIST_LAZY_OPENSSL(kCrypto, BIO*, BIO_new_file, (const char* filename, const char* mode),
                  (filename, mode))
DIST_LAZY_OPENSSL(kCrypto, BIO*, BIO_new_mem_buf, (const void* buf, int len), (buf, len))
DIST_LAZY_OPENSSL(kCrypto, int, BIO_read, (BIO * b, void* data, int dlen), (b, data, dlen))
DIST_LAZY_OPENSSL(kCrypto, int, BIO_write, (BIO * b, const void* data, int dlen), (b, data, dlen))
DIST_LAZY_OPENSSL(kCrypto, void, CRYPTO_free, (void* ptr, const char* file, int line),
                  (ptr, file, line))
DIST_LAZY_OPENSSL(kCrypto, void, DH_free, (DH * dh), (dh))
DIST_LAZY_OPENSSL(kCrypto, void, ERR_clear_error, (), ())
DIST_LAZY_OPENSSL(kCrypto, unsigned long, ERR_get_error, (), ())
DIST_LAZY_OPENSSL(kCrypto, unsigned long, ERR_peek_error, (), ())
DIST_LAZY_OPENSSL(kCrypto, unsigned long, ERR_peek_last_error, (), ())
DIST_LAZY_OPENSSL(kCrypto, const char*, ERR_reason_error_string, (unsigned long e), (e))
DIST_LAZY_OPENSSL(kCrypto, void, EVP_PKEY_free, (EVP_PKEY * pkey), (pkey))
DIST_LAZY_OPENSSL(kCrypto, DH*, PEM_read_bio_DHparams,
                  (BIO * out, DH** x, pem_password_cb* cb, void* u), (out, x, cb, u))
DIST_LAZY_OPENSSL(kCrypto, EVP_PKEY*, PEM_read_bio_PrivateKey,
                  (BIO * out, EVP_PKEY** x, pem_password_cb* cb, void* u), (out, x, cb, u))
DIST_LAZY_OPENSSL(kCrypto, RSA*, PEM_read_bio_RSAPrivateKey,
                  (BIO * out, RSA** x, pem_password_cb* cb, void* u), (out, x, cb, u))
DIST_LAZY_OPENSSL(kCrypto, X509*, PEM_read_bio_X509,
                  (BIO * out, X509** x, pem_password_cb* cb, void* u), (out, x, cb, u))
DIST_LAZY_OPENSSL(kCrypto, X509*, PEM_read_bio_X509_AUX,
                  (BIO * out, X509** x, pem_password_cb* cb, void* u), (out, x, cb, u))
DIST_LAZY_OPENSSL(kCrypto, void, RSA_free, (RSA * r), (r))
DIST_LAZY_OPENSSL(kSsl, uint64_t, SSL_CTX_clear_options, (SSL_CTX * ctx, uint64_t op), (ctx, op))
DIST_LAZY_OPENSSL(kSsl, long, SSL_CTX_ctrl, (SSL_CTX * ctx, int cmd, long larg, void* parg),
                  (ctx, cmd, larg, parg))
DIST_LAZY_OPENSSL(kSsl, void, SSL_CTX_free, (SSL_CTX * a0), (a0))
DIST_LAZY_OPENSSL(kSsl, X509_STORE*, SSL_CTX_get_cert_store, (const SSL_CTX* a0), (a0))
DIST_LAZY_OPENSSL(kSsl, pem_password_cb*, SSL_CTX_get_default_passwd_cb, (SSL_CTX * ctx), (ctx))
DIST_LAZY_OPENSSL(kSsl, void*, SSL_CTX_get_default_passwd_cb_userdata, (SSL_CTX * ctx), (ctx))
DIST_LAZY_OPENSSL(kSsl, void*, SSL_CTX_get_ex_data, (const SSL_CTX* ssl, int idx), (ssl, idx))
DIST_LAZY_OPENSSL(kSsl, SSL_verify_cb, SSL_CTX_get_verify_callback, (const SSL_CTX* ctx), (ctx))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_get_verify_mode, (const SSL_CTX* ctx), (ctx))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_load_verify_locations,
                  (SSL_CTX * ctx, const char* CAfile, const char* CApath), (ctx, CAfile, CApath))
DIST_LAZY_OPENSSL(kSsl, SSL_CTX*, SSL_CTX_new, (const SSL_METHOD* meth), (meth))
DIST_LAZY_OPENSSL(kSsl, void, SSL_CTX_set_default_passwd_cb, (SSL_CTX * ctx, pem_password_cb* cb),
                  (ctx, cb))
DIST_LAZY_OPENSSL(kSsl, void, SSL_CTX_set_default_passwd_cb_userdata, (SSL_CTX * ctx, void* u),
                  (ctx, u))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_set_default_verify_paths, (SSL_CTX * ctx), (ctx))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_set_ex_data, (SSL_CTX * ssl, int idx, void* data),
                  (ssl, idx, data))
DIST_LAZY_OPENSSL(kSsl, uint64_t, SSL_CTX_set_options, (SSL_CTX * ctx, uint64_t op), (ctx, op))
DIST_LAZY_OPENSSL(kSsl, void, SSL_CTX_set_verify, (SSL_CTX * ctx, int mode, SSL_verify_cb callback),
                  (ctx, mode, callback))
DIST_LAZY_OPENSSL(kSsl, void, SSL_CTX_set_verify_depth, (SSL_CTX * ctx, int depth), (ctx, depth))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_PrivateKey, (SSL_CTX * ctx, EVP_PKEY* pkey), (ctx, pkey))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_PrivateKey_file,
                  (SSL_CTX * ctx, const char* file, int type), (ctx, file, type))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_RSAPrivateKey, (SSL_CTX * ctx, RSA* rsa), (ctx, rsa))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_RSAPrivateKey_file,
                  (SSL_CTX * ctx, const char* file, int type), (ctx, file, type))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_certificate, (SSL_CTX * ctx, X509* x), (ctx, x))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_certificate_ASN1,
                  (SSL_CTX * ctx, int len, const unsigned char* d), (ctx, len, d))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_certificate_chain_file, (SSL_CTX * ctx, const char* file),
                  (ctx, file))
DIST_LAZY_OPENSSL(kSsl, int, SSL_CTX_use_certificate_file,
                  (SSL_CTX * ctx, const char* file, int type), (ctx, file, type))
DIST_LAZY_OPENSSL(kSsl, int, SSL_accept, (SSL * ssl), (ssl))
DIST_LAZY_OPENSSL(kSsl, int, SSL_connect, (SSL * ssl), (ssl))
DIST_LAZY_OPENSSL(kSsl, long, SSL_ctrl, (SSL * ssl, int cmd, long larg, void* parg),
                  (ssl, cmd, larg, parg))
DIST_LAZY_OPENSSL(kSsl, void, SSL_free, (SSL * ssl), (ssl))
DIST_LAZY_OPENSSL(kSsl, SSL_CTX*, SSL_get_SSL_CTX, (const SSL* ssl), (ssl))
DIST_LAZY_OPENSSL(kSsl, int, SSL_get_error, (const SSL* s, int ret_code), (s, ret_code))
DIST_LAZY_OPENSSL(kSsl, void*, SSL_get_ex_data, (const SSL* ssl, int idx), (ssl, idx))
DIST_LAZY_OPENSSL(kSsl, int, SSL_get_ex_data_X509_STORE_CTX_idx, (), ())
DIST_LAZY_OPENSSL(kSsl, int, SSL_get_shutdown, (const SSL* ssl), (ssl))
DIST_LAZY_OPENSSL(kSsl, SSL_verify_cb, SSL_get_verify_callback, (const SSL* s), (s))
DIST_LAZY_OPENSSL(kSsl, int, SSL_get_verify_mode, (const SSL* s), (s))
DIST_LAZY_OPENSSL(kSsl, SSL*, SSL_new, (SSL_CTX * ctx), (ctx))
DIST_LAZY_OPENSSL(kSsl, int, SSL_read, (SSL * ssl, void* buf, int num), (ssl, buf, num))
DIST_LAZY_OPENSSL(kSsl, void, SSL_set_bio, (SSL * s, BIO* rbio, BIO* wbio), (s, rbio, wbio))
DIST_LAZY_OPENSSL(kSsl, int, SSL_set_ex_data, (SSL * ssl, int idx, void* data), (ssl, idx, data))
DIST_LAZY_OPENSSL(kSsl, void, SSL_set_verify, (SSL * s, int mode, SSL_verify_cb callback),
                  (s, mode, callback))
DIST_LAZY_OPENSSL(kSsl, void, SSL_set_verify_depth, (SSL * s, int depth), (s, depth))
DIST_LAZY_OPENSSL(kSsl, int, SSL_shutdown, (SSL * s), (s))
DIST_LAZY_OPENSSL(kSsl, int, SSL_write, (SSL * ssl, const void* buf, int num), (ssl, buf, num))
DIST_LAZY_OPENSSL(kSsl, const SSL_METHOD*, TLS_client_method, (), ())
DIST_LAZY_OPENSSL(kSsl, const SSL_METHOD*, TLS_method, (), ())
DIST_LAZY_OPENSSL(kSsl, const SSL_METHOD*, TLS_server_method, (), ())
DIST_LAZY_OPENSSL(kCrypto, X509*, X509_STORE_CTX_get_current_cert, (const X509_STORE_CTX* ctx),
                  (ctx))
DIST_LAZY_OPENSSL(kCrypto, int, X509_STORE_CTX_get_error_depth, (const X509_STORE_CTX* ctx), (ctx))
DIST_LAZY_OPENSSL(kCrypto, void*, X509_STORE_CTX_get_ex_data, (const X509_STORE_CTX* ctx, int idx),
                  (ctx, idx))
DIST_LAZY_OPENSSL(kCrypto, int, X509_STORE_add_cert, (X509_STORE * ctx, X509* x), (ctx, x))
DIST_LAZY_OPENSSL(kCrypto, int, X509_check_host,
                  (X509 * x, const char* chk, size_t chklen, unsigned int flags, char** peername),
                  (x, chk, chklen, flags, peername))
DIST_LAZY_OPENSSL(kCrypto, int, X509_check_ip_asc,
                  (X509 * x, const char* ipasc, unsigned int flags), (x, ipasc, flags))
DIST_LAZY_OPENSSL(kCrypto, void, X509_free, (X509 * a), (a))
DIST_LAZY_OPENSSL(kCrypto, EVP_PKEY*, d2i_PrivateKey_bio, (BIO * bp, EVP_PKEY** a), (bp, a))
DIST_LAZY_OPENSSL(kCrypto, RSA*, d2i_RSAPrivateKey_bio, (BIO * bp, RSA** rsa), (bp, rsa))
#pragma GCC diagnostic pop
