// Compiles Boost.Asio's TLS support once (BOOST_ASIO_SEPARATE_COMPILATION), for the etcd client.
#include <boost/asio/ssl/impl/src.hpp>
