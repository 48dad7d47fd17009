#include "warm/snapshot_replicas.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>  // renameat2
#include <cstring>
#include <list>
#include <sstream>
#include <stdexcept>

#include "dist/contract/snapshot_format.h"
#include "dist/store/auth.h"
#include "dist/store/client.h"
#include "warm/snapshot_store.h"

namespace dist::agent::warm {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kWireMagic[] = "DLREPL01";
constexpr std::size_t kWireMagicBytes = 8;
constexpr char kClientLabel[] = "dist-launch/replica/client/v1";
constexpr char kServerLabel[] = "dist-launch/replica/server/v1";
constexpr std::uint8_t kPut = 1, kGet = 2, kStat = 3;
constexpr std::uint8_t kReplyOk = 0, kReplyNone = 1, kReplyRefused = 2, kReplyNoRoom = 3,
                       kReplyBadRequest = 4;
constexpr std::size_t kMaxJobBytes = 4096;
constexpr std::uint64_t kMaxReplicaBytes = 1ULL << 40;
constexpr int kMaxConnections = 16;  // served at once; more wait in the listen queue
constexpr std::chrono::seconds kServersRefresh{5};
constexpr int kBackgroundNice = 10;

// The replicas of every save are sent, and taken, in the background: at the lowest priority, so
// that a node whose cores the workers keep busy trains as fast as without replicas (its replicas
// then lag, skipping saves; each is the rank's newest when it goes). Restores are not background.
void lower_this_threads_priority() {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kBackgroundNice);
}

// ---- sockets ------------------------------------------------------------------------------

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  explicit operator bool() const { return fd >= 0; }
};

void set_timeouts(int fd, std::chrono::seconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count());
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool send_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    n -= static_cast<std::size_t>(sent);
  }
  return true;
}

constexpr Clock::time_point kNoDeadline = Clock::time_point::max();
constexpr std::chrono::seconds kHandshakeTimeout{5};  // a request's first bytes to its last

// `n` bytes; false once the connection closes, a read waits past kReplicaIoTimeout, or
// `deadline` passes (a peer that trickles bytes holds no one past it).
bool recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline = kNoDeadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (Clock::now() > deadline) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

template <typename T>
void put(std::string& out, T value) {  // little-endian: the machines this runs on
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
template <typename T>
bool take(int fd, T& value, Clock::time_point deadline = kNoDeadline) {
  return recv_all(fd, &value, sizeof value, deadline);
}

// `size` bytes of the file `in` to the socket.
bool send_file(int socket, int in, std::uint64_t size, std::atomic<std::uint64_t>& counted) {
  off_t offset = 0;
  while (static_cast<std::uint64_t>(offset) < size) {
    const ssize_t n = ::sendfile(socket, in, &offset, static_cast<std::size_t>(size - offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    counted += static_cast<std::uint64_t>(n);
  }
  return true;
}

// `size` bytes from the socket into the file `out`, by `deadline`. (Received into the file's
// mapped pages instead, it cost more CPU: tmpfs zeroes each page first.)
bool receive_file(int socket, int out, std::uint64_t size,
                  Clock::time_point deadline = kNoDeadline) {
  std::vector<char> buffer(std::min<std::uint64_t>(size, 1 << 20));
  while (size > 0) {
    if (Clock::now() > deadline) return false;
    const ssize_t got =
        ::recv(socket, buffer.data(), std::min<std::uint64_t>(size, buffer.size()), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    for (ssize_t done = 0; done < got;) {
      const ssize_t n = ::write(out, buffer.data() + done, static_cast<std::size_t>(got - done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += n;
    }
    size -= static_cast<std::uint64_t>(got);
  }
  return true;
}

Fd connect_to(const std::string& endpoint_text, std::chrono::milliseconds timeout) {
  store::Endpoint endpoint;
  try {
    endpoint = store::parse_endpoint(endpoint_text);
  } catch (const std::exception&) {
    return {};
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(endpoint.host.c_str(), std::to_string(endpoint.port).c_str(), &hints, &found) !=
      0) {
    return {};
  }
  Fd result;
  for (addrinfo* a = found; a && !result; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) continue;
    if (::connect(fd.fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) continue;
      pollfd p{fd.fd, POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof error;
      if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1 ||
          ::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
        continue;
      }
    }
    ::fcntl(fd.fd, F_SETFL, ::fcntl(fd.fd, F_GETFL) & ~O_NONBLOCK);
    set_timeouts(fd.fd, kReplicaIoTimeout);
    result = std::move(fd);
  }
  ::freeaddrinfo(found);
  return result;
}

std::vector<std::string> lines_of(const std::optional<std::string>& value) {
  std::vector<std::string> lines;
  if (!value) return lines;
  std::istringstream in(*value);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && std::find(lines.begin(), lines.end(), line) == lines.end()) {
      lines.push_back(line);
    }
  }
  return lines;
}

std::string rank_folder(int rank) {
  return std::string(snapshot_format::kRankFolderPrefix) + std::to_string(rank);
}

std::optional<int> rank_of_folder(const std::string& name) {
  if (!name.starts_with(snapshot_format::kRankFolderPrefix)) return std::nullopt;
  try {
    std::size_t used = 0;
    const std::string digits = name.substr(std::strlen(snapshot_format::kRankFolderPrefix));
    const int rank = std::stoi(digits, &used);
    if (used == digits.size() && rank >= 0) return rank;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A rank folder's snapshot files as stat sees them (names, inodes, sizes, times): unchanged since
// the last scan, no header in it needs reading again (a header of a large state's many tensors is
// megabytes of JSON, and the sender looks every kReplicaScanInterval).
std::string folder_signature(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0) continue;
    files.push_back(entry.path().filename().string() + ':' + std::to_string(st.st_ino) + ':' +
                    std::to_string(st.st_size) + ':' + std::to_string(st.st_mtim.tv_sec) + '.' +
                    std::to_string(st.st_mtim.tv_nsec));
  }
  std::sort(files.begin(), files.end());
  std::string signature;
  for (const auto& f : files) signature += f + ';';
  return signature;
}

std::string megabytes(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

// A conversation's opening, from either side: the nonces and proofs (docs at the header).
struct Opening {
  store::auth::Nonce server_nonce{};
  store::auth::Nonce client_nonce{};
};

struct Request {
  std::uint8_t op = 0;
  std::string job;
  std::int32_t rank = -1;
  // PUT
  std::uint64_t save_id = 0;
  std::int64_t saved_at = 0;
  std::uint64_t size = 0;
};

constexpr int kNoAnswer = -1;

// The request's bytes after the proof: what the client's proof covers too, so that no one on the
// path can pass a real agent's proof on with another request.
std::string encode(const Request& r) {
  std::string out;
  put(out, r.op);
  put(out, static_cast<std::uint32_t>(r.job.size()));
  out += r.job;
  put(out, r.rank);
  if (r.op == kPut) {
    put(out, r.save_id);
    put(out, r.saved_at);
    put(out, r.size);
  }
  return out;
}

store::auth::Mac client_proof(const std::string& secret, const Opening& o,
                              const std::string& request) {
  if (secret.empty()) return {};
  return store::auth::proof(kClientLabel + request, secret, o.server_nonce, o.client_nonce);
}

// The server's proof covers the request it answers and its status.
store::auth::Mac server_proof(const std::string& secret, const Opening& o,
                              const std::string& request, std::uint8_t status) {
  if (secret.empty()) return {};
  return store::auth::proof(kServerLabel + request + static_cast<char>(status), secret,
                            o.server_nonce, o.client_nonce);
}

// The request's status (kReply*), or kNoAnswer (said in `why`) when the peer did not answer as one
// of this job's replica servers.
int ask(int fd, const Request& r, const std::string& secret, std::string& why,
        Clock::time_point deadline = kNoDeadline) {
  char magic[kWireMagicBytes];
  Opening o;
  if (!recv_all(fd, magic, sizeof magic, deadline) ||
      std::memcmp(magic, kWireMagic, kWireMagicBytes) != 0 ||
      !recv_all(fd, o.server_nonce.data(), o.server_nonce.size(), deadline)) {
    why = "it is not a replica server";
    return kNoAnswer;
  }
  o.client_nonce = store::auth::random_nonce();
  const std::string request = encode(r);
  const store::auth::Mac mine = client_proof(secret, o, request);
  std::string out;
  out.append(reinterpret_cast<const char*>(o.client_nonce.data()), o.client_nonce.size());
  out.append(reinterpret_cast<const char*>(mine.data()), mine.size());
  out += request;
  store::auth::Mac theirs{};
  std::uint8_t status = 0;
  if (!send_all(fd, out.data(), out.size()) ||
      !recv_all(fd, theirs.data(), theirs.size(), deadline) || !take(fd, status, deadline)) {
    why = "the connection closed";
    return kNoAnswer;
  }
  if (status == kReplyRefused) {
    why = "it refused this agent's token (not this job's agent, or another token)";
    return kNoAnswer;
  }
  if (!secret.empty()) {
    const auto expected = server_proof(secret, o, request, status);
    if (!store::auth::equal(expected.data(), theirs.data(), expected.size())) {
      why = "its proof does not match this job's token";
      return kNoAnswer;
    }
  }
  return status;
}

}  // namespace

// ---- the server: the replicas this agent holds for others ---------------------------------

class SnapshotReplicas::Server {
 public:
  // `held`: the replicas it keeps for others; `own`: this node's snapshots, served too (a rank
  // that moved to another node in the next round finds its state here).
  // Listens on `bind` (an address of this host; "": every interface, as the store the agent
  // hosts does) and is known to the others as `advertised`.
  Server(const std::string& bind, const std::string& advertised, const ReplicaOptions& options,
         fs::path held, fs::path own)
      : options_(options), held_(std::move(held)), own_(std::move(own)) {
    fs::create_directories(held_);
    std::string why = "not an address of this host";
    for (const std::string& address :
         bind.empty() ? std::vector<std::string>{"::", "0.0.0.0"} : std::vector{bind}) {
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
      addrinfo* found = nullptr;
      if (::getaddrinfo(address.c_str(), "0", &hints, &found) != 0 || !found) continue;
      Fd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      const int one = 1, zero = 0;
      ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (found->ai_family == AF_INET6) {
        ::setsockopt(fd.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
      }
      const bool bound =
          fd && ::bind(fd.fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd.fd, 64) == 0;
      if (!bound) why = std::strerror(errno);
      ::freeaddrinfo(found);
      if (bound) {
        listener_ = std::move(fd);
        break;
      }
    }
    if (!listener_) {
      throw std::runtime_error("cannot serve snapshot replicas on " +
                               (bind.empty() ? std::string("this host") : bind) + ": " + why);
    }
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    ::getsockname(listener_.fd, reinterpret_cast<sockaddr*>(&local), &length);
    const auto port =
        ntohs(local.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&local)->sin_port
                                         : reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    endpoint_ = store::Endpoint{advertised, port}.to_string();
    if (::pipe2(wake_, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (const int fd : open_) ::shutdown(fd, SHUT_RDWR);  // a transfer under way ends now
    }
    const char byte = 0;
    [[maybe_unused]] const auto n = ::write(wake_[1], &byte, 1);
    acceptor_.join();
    for (auto& c : connections_) c.thread.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  const std::string& endpoint() const { return endpoint_; }

  // The ranks it holds a replica of (their newest).
  std::vector<std::pair<int, Saved>> held() const {
    std::vector<std::pair<int, Saved>> all;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(held_, ec)) {
      const auto rank = rank_of_folder(entry.path().filename().string());
      if (!rank) continue;
      auto saved = snapshots_in(entry.path());
      if (!saved.empty()) all.emplace_back(*rank, std::move(saved.back()));
    }
    std::sort(all.begin(), all.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    return all;
  }

  std::uint64_t bytes_received() const { return bytes_received_; }

 private:
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  void accept_loop() {
    for (;;) {
      pollfd fds[2] = {{listener_.fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 2, 1000) < 0 && errno != EINTR) return;
      if (fds[1].revents) return;
      reap();
      if (!(fds[0].revents & POLLIN)) continue;
      const int fd = ::accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      if (connections_.size() >= static_cast<std::size_t>(kMaxConnections)) {
        ::close(fd);  // busy: the client tries another holder, or again (never a stalled accept)
        continue;
      }
      set_timeouts(fd, kReplicaIoTimeout);
      {
        std::lock_guard lock(mutex_);
        if (stopping_) {
          ::close(fd);
          return;
        }
        open_.insert(fd);
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      connections_.push_back({std::thread([this, fd, done] {
                                serve(fd);
                                {
                                  std::lock_guard lock(mutex_);
                                  open_.erase(fd);
                                }
                                ::close(fd);
                                *done = true;
                              }),
                              done});
    }
  }

  void reap() {
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (*it->done) {
        it->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The status, with this server's proof (`proven`: the client proved itself first).
  bool reply(int fd, const Opening& o, const std::string& request, std::uint8_t status,
             bool proven) {
    const store::auth::Mac mine =
        proven ? server_proof(options_.secret, o, request, status) : store::auth::Mac{};
    std::string out(reinterpret_cast<const char*>(mine.data()), mine.size());
    put(out, status);
    return send_all(fd, out.data(), out.size());
  }

  void serve(int fd) {
    Opening o;
    o.server_nonce = store::auth::random_nonce();
    std::string hello(kWireMagic, kWireMagicBytes);
    hello.append(reinterpret_cast<const char*>(o.server_nonce.data()), o.server_nonce.size());
    store::auth::Mac theirs{};
    Request r;
    std::uint32_t job_bytes = 0;
    const auto by = Clock::now() + kHandshakeTimeout;  // a stranger holds no slot longer
    if (!send_all(fd, hello.data(), hello.size()) ||
        !recv_all(fd, o.client_nonce.data(), o.client_nonce.size(), by) ||
        !recv_all(fd, theirs.data(), theirs.size(), by) || !take(fd, r.op, by) ||
        !take(fd, job_bytes, by) || job_bytes > kMaxJobBytes) {
      return;
    }
    r.job.resize(job_bytes);
    if (!recv_all(fd, r.job.data(), job_bytes, by) || !take(fd, r.rank, by)) return;
    if (r.op == kPut &&
        (!take(fd, r.save_id, by) || !take(fd, r.saved_at, by) || !take(fd, r.size, by))) {
      return;
    }
    const std::string request = encode(r);
    if (!options_.secret.empty()) {
      const auto expected = client_proof(options_.secret, o, request);
      if (!store::auth::equal(expected.data(), theirs.data(), expected.size())) {
        spdlog::warn("snapshot replicas: refused a connection without this job's token");
        reply(fd, o, request, kReplyRefused, false);
        return;
      }
    }
    if (r.job != options_.job || r.rank < 0 || (r.op != kPut && r.op != kGet && r.op != kStat)) {
      reply(fd, o, request, kReplyBadRequest, true);
      return;
    }
    const fs::path folder = held_ / rank_folder(r.rank);
    if (r.op == kPut) {
      lower_this_threads_priority();
      return take_replica(fd, o, request, r, folder);
    }
    // The newest of the replica held and this node's own saves of the rank.
    std::optional<Saved> newest;
    Fd file;
    {
      std::lock_guard lock(files_);
      auto saved = snapshots_in(folder);
      for (auto& own : snapshots_in(own_ / rank_folder(r.rank))) {
        if (own.stamp.job == options_.job) saved.push_back(std::move(own));
      }
      std::sort(saved.begin(), saved.end(),
                [](const Saved& a, const Saved& b) { return a.stamp.saved_at < b.stamp.saved_at; });
      if (!saved.empty()) {
        newest = saved.back();
        file = Fd(::open(newest->path.c_str(), O_RDONLY | O_CLOEXEC));  // outlives its removal
      }
    }
    struct stat st {};
    if (!newest || !file || ::fstat(file.fd, &st) != 0) {
      reply(fd, o, request, kReplyNone, true);
      return;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (!reply(fd, o, request, kReplyOk, true)) return;
    std::string out;
    if (r.op == kStat) {
      put(out, newest->stamp.saved_at);
      put(out, size);
      put(out, newest->stamp.save_id);
      send_all(fd, out.data(), out.size());
      return;
    }
    put(out, size);
    // Whole when its writer did not rewrite it meanwhile (a node's own save can be recycled): the
    // header is the one it had before (the footer, which the client checks, shows the rest).
    const std::string header = header_of(file.fd);
    std::atomic<std::uint64_t> sent{0};
    if (!send_all(fd, out.data(), out.size()) || !send_file(fd, file.fd, size, sent)) return;
    const std::uint8_t whole = header_of(file.fd) == header ? 1 : 0;
    send_all(fd, &whole, 1);
  }

  void take_replica(int fd, const Opening& o, const std::string& request, const Request& r,
                    const fs::path& folder) {
    if (r.size < snapshot_format::kPrefixBytes + snapshot_format::kFooterBytes ||
        r.size > kMaxReplicaBytes) {
      reply(fd, o, request, kReplyBadRequest, true);
      return;
    }
    {
      std::lock_guard lock(files_);
      const auto saved = snapshots_in(folder);
      if (!saved.empty() &&
          (saved.back().stamp.save_id == r.save_id || saved.back().stamp.saved_at >= r.saved_at)) {
        reply(fd, o, request, kReplyNone, true);  // this save, or a newer one, is here
        return;
      }
    }
    struct statvfs info {};
    if (::statvfs(held_.c_str(), &info) == 0 &&
        static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize < r.size) {
      if (!said_no_room_.exchange(true)) {
        spdlog::warn(
            "snapshot replicas: no room in {} for rank {}'s replica ({}): replicas of other "
            "nodes need shared memory here too; give the container more (docker --shm-size)",
            held_.string(), r.rank, megabytes(r.size));
      }
      reply(fd, o, request, kReplyNoRoom, true);
      return;
    }
    std::error_code ec;
    fs::create_directories(folder, ec);
    std::ostringstream name;
    name << ".tmp." << r.save_id << "." << std::this_thread::get_id();
    const fs::path partial = folder / name.str();
    Fd out(::open(partial.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::uint8_t whole = 0;
    const bool received = out && reply(fd, o, request, kReplyOk, true) &&
                          receive_file(fd, out.fd, r.size) && take(fd, whole) && whole == 1;
    out.reset();
    const auto stamp = received ? read_stamp(partial) : std::nullopt;
    const bool ours =
        stamp && stamp->save_id == r.save_id && stamp->job == options_.job && stamp->rank == r.rank;
    if (!ours) {
      fs::remove(partial, ec);
      if (received) answer(fd, kReplyBadRequest);
      return;
    }
    bytes_received_ += r.size;
    {
      std::lock_guard lock(files_);
      const auto saved = snapshots_in(folder);
      if (!saved.empty() && saved.back().stamp.saved_at > stamp->saved_at) {
        fs::remove(partial, ec);  // a newer one came meanwhile
      } else {
        const fs::path target = folder / snapshot_name(stamp->step);
        fs::rename(partial, target, ec);
        if (ec) {
          spdlog::warn("snapshot replicas: cannot keep rank {}'s replica in {}: {}", r.rank,
                       folder.string(), ec.message());
          fs::remove(partial, ec);
          return answer(fd, kReplyNoRoom);
        }
        for (const auto& s : saved) {
          if (s.path != target) fs::remove(s.path, ec);  // each rank's newest only
        }
      }
    }
    answer(fd, kReplyOk);
  }

  // The last word on a PUT: a status byte alone.
  static void answer(int fd, std::uint8_t status) { send_all(fd, &status, 1); }

  const ReplicaOptions& options_;
  fs::path held_;
  fs::path own_;
  Fd listener_;
  std::string endpoint_;
  int wake_[2] = {-1, -1};
  std::thread acceptor_;
  std::list<Connection> connections_;  // the acceptor's
  std::mutex mutex_;
  bool stopping_ = false;
  std::set<int> open_;
  std::mutex files_;  // the held folders' files: a put in place against a read of the newest
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<bool> said_no_room_{false};
};

// ---- the agent's side ---------------------------------------------------------------------

SnapshotReplicas::SnapshotReplicas(ReplicaOptions options, fs::path snapshots, fs::path held)
    : options_(std::move(options)), snapshots_(std::move(snapshots)), held_(std::move(held)) {
  sender_ = std::thread([this] { run_sender(); });
  restorer_ = std::thread([this] { run_restorer(); });
}

SnapshotReplicas::~SnapshotReplicas() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const int fd : in_flight_) ::shutdown(fd, SHUT_RDWR);  // a transfer under way ends now
  }
  wake_.notify_all();
  sender_.join();
  restorer_.join();
  if (saves_sent_ > 0 || (server_ && server_->bytes_received() > 0)) {
    spdlog::info("snapshot replicas: {} saves sent to other nodes ({}), {} received from them",
                 saves_sent_.load(), megabytes(bytes_sent_), megabytes(server_->bytes_received()));
  }
  server_.reset();
}

// A connection the destructor ends at once (a peer that went quiet would hold it for
// kReplicaIoTimeout); none is opened once it began.
class SnapshotReplicas::InFlight {
 public:
  InFlight(SnapshotReplicas& owner, std::string_view peer) : owner_(owner) {
    Fd connected = connect_to(std::string(peer), kReplicaConnectTimeout);  // not under the lock
    std::lock_guard lock(owner_.mutex_);
    if (owner_.stopping_ || !connected) return;
    socket = std::move(connected);
    owner_.in_flight_.insert(socket.fd);
  }
  ~InFlight() {
    std::lock_guard lock(owner_.mutex_);
    owner_.in_flight_.erase(socket.fd);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  Fd socket;

 private:
  SnapshotReplicas& owner_;
};

std::string SnapshotReplicas::key(const std::string& name) const {
  return "dist-launch/replicas/" + job_folder(options_.job) + "/" + name;
}

void SnapshotReplicas::use_store(const store::Endpoint& endpoint) {
  {
    std::lock_guard lock(mutex_);
    store_ = endpoint;
    ++rounds_;
  }
  wake_.notify_all();
}

void SnapshotReplicas::cancel_restores() {
  ++restore_epoch_;
}

std::vector<int> SnapshotReplicas::missing(const std::vector<int>& ranks) const {
  std::vector<int> none;
  for (const int rank : ranks) {
    if (snapshots_in(snapshots_ / rank_folder(rank)).empty()) none.push_back(rank);
  }
  return none;
}

void SnapshotReplicas::restore(std::vector<int> ranks, int other_nodes,
                               std::function<void()> done) {
  {
    std::lock_guard lock(mutex_);
    restores_.push_back({std::move(ranks), other_nodes, restore_epoch_.load(), std::move(done)});
  }
  wake_.notify_all();
}

std::unique_ptr<store::StoreClient> SnapshotReplicas::open_store(const store::Endpoint& endpoint) {
  store::ClientOptions o;
  o.host = endpoint.host;
  o.port = endpoint.port;
  o.secret = options_.secret;
  o.connect_timeout = std::chrono::seconds(5);
  o.timeout = std::chrono::seconds(10);
  return std::make_unique<store::StoreClient>(store::StoreClient::connect(std::move(o)));
}

// ---- sending ------------------------------------------------------------------------------

void SnapshotReplicas::run_sender() {
  lower_this_threads_priority();
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    // A new store is joined at once: a restore in it waits for this agent's registration.
    wake_.wait_for(lock, kReplicaScanInterval,
                   [this] { return stopping_ || (store_ && store_ != connected_store_); });
    if (stopping_ || !store_) continue;
    const store::Endpoint endpoint = *store_;
    const std::uint64_t rounds = rounds_;
    lock.unlock();
    try {
      if (!session_ || endpoint != connected_store_) connect_store(endpoint);
      if (rounds != rounds_seen_) {
        // A new round may have lost a holder: each rank's newest goes to the ring again (a
        // holder that has it says so, and nothing is sent).
        rounds_seen_ = rounds;
        delivered_.clear();
      }
      send_new_saves();
      failing_since_.reset();
    } catch (const std::exception& e) {
      // A round's store closes as the next one opens: said only when it lasts.
      const auto now = Clock::now();
      if (!failing_since_) failing_since_ = now;
      if (now - *failing_since_ > kStoreTrouble && !std::exchange(said_store_error_, true)) {
        spdlog::warn("snapshot replicas: {} (retrying)", e.what());
      }
      spdlog::debug("snapshot replicas: {}", e.what());
      session_.reset();
      connected_store_.reset();
    }
    lock.lock();
  }
}

// A new store (the first, or the round's worker store moved): this agent serves (from the first)
// and says so there, with the replicas it holds and the holders it gave its ranks, so that a
// restore in this store finds them.
void SnapshotReplicas::connect_store(const store::Endpoint& endpoint) {
  session_.reset();
  session_ = open_store(endpoint);
  if (!server_) {
    auto server =
        std::make_unique<Server>(options_.bind, options_.address, options_, held_, snapshots_);
    std::lock_guard lock(mutex_);
    server_ = std::move(server);
    spdlog::info(
        "snapshot replicas: serving on {}, each rank's newest snapshot kept by {} other "
        "node{}",
        server_->endpoint(), options_.replicas, options_.replicas == 1 ? "" : "s");
  }
  // What it holds and where its ranks are held first: a restore reads them once `servers` names
  // this agent.
  for (const auto& [rank, saved] : server_->held()) {
    session_->append(key(rank_folder(rank)), server_->endpoint() + "\n");
  }
  for (const auto& [folder, holders] : recorded_) {
    for (const auto& holder : holders) session_->append(key(folder), holder + "\n");
  }
  session_->append(key("servers"), server_->endpoint() + "\n");
  std::lock_guard lock(mutex_);
  connected_store_ = endpoint;
  servers_read_ = {};
}

// The K peers after this agent in the ring of servers, passing over those resting.
std::vector<std::string> SnapshotReplicas::peers() {
  const auto now = Clock::now();
  if (now - servers_read_ > kServersRefresh) {
    servers_ = lines_of(session_->try_get(key("servers")));
    servers_read_ = now;
  }
  const auto self = std::find(servers_.begin(), servers_.end(), server_->endpoint());
  const std::size_t start = self == servers_.end() ? 0 : self - servers_.begin() + 1;
  std::vector<std::string> chosen;
  for (std::size_t i = 0; i < servers_.size() && chosen.size() < std::size_t(options_.replicas);
       ++i) {
    const std::string& peer = servers_[(start + i) % servers_.size()];
    if (peer == server_->endpoint()) continue;
    if (const auto r = resting_.find(peer); r != resting_.end() && r->second > now) continue;
    chosen.push_back(peer);
  }
  if (chosen.size() < std::size_t(options_.replicas)) servers_read_ = {};  // newcomers, next time
  return chosen;
}

void SnapshotReplicas::send_new_saves() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(snapshots_, ec)) {
    const std::string folder = entry.path().filename().string();
    const auto rank = rank_of_folder(folder);
    if (!rank) continue;
    std::string signature = folder_signature(entry.path());
    if (const auto d = delivered_.find(folder);
        d != delivered_.end() && d->second.signature == signature &&
        (d->second.rejected || d->second.holders.size() >= std::size_t(options_.replicas))) {
      continue;  // nothing new, and its newest is where it should be
    }
    const auto saved = snapshots_in(entry.path());
    if (saved.empty()) continue;
    const Saved& newest = saved.back();
    // This node holds its own ranks' saves: where a rank that moves in the next round finds it.
    if (recorded_[folder].insert(server_->endpoint()).second) {
      session_->append(key(folder), server_->endpoint() + "\n");
    }
    Delivery& d = delivered_[folder];
    if (d.save_id != newest.stamp.save_id) d = Delivery{newest.stamp.save_id, {}, false, {}};
    d.signature = std::move(signature);
    if (d.rejected || d.holders.size() >= std::size_t(options_.replicas)) continue;
    for (const auto& peer : peers()) {
      if (d.holders.contains(peer)) continue;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
      }
      const Sent sent = send(peer, *rank, newest);
      if (sent == Sent::kRewritten) break;  // a newer save is coming: the next scan takes it
      if (sent == Sent::kRejected) {
        d.rejected = true;
        break;
      }
      if (sent == Sent::kFailed) {
        resting_[peer] = Clock::now() + kPeerRestPeriod;
        continue;
      }
      d.holders.insert(peer);
      if (recorded_[folder].insert(peer).second) session_->append(key(folder), peer + "\n");
    }
  }
}

SnapshotReplicas::Sent SnapshotReplicas::send(const std::string& peer, int rank,
                                              const Saved& save) {
  Fd file(::open(save.path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!file || ::fstat(file.fd, &st) != 0) return Sent::kRewritten;
  const std::string header = header_of(file.fd);
  InFlight connection(*this, peer);
  const Fd& socket = connection.socket;
  std::string why = "it does not answer";
  Request r{kPut,
            options_.job,
            rank,
            save.stamp.save_id,
            save.stamp.saved_at,
            static_cast<std::uint64_t>(st.st_size)};
  // A transfer that failed, or a copy the holder found torn, because the writer recycled the file
  // meanwhile is no fault of the peer's, nor of the save's.
  const auto rewritten = [&] {
    struct stat now {};
    return ::fstat(file.fd, &now) != 0 || now.st_size != st.st_size || header_of(file.fd) != header;
  };
  const int status = socket ? ask(socket.fd, r, options_.secret, why) : kNoAnswer;
  if (status == kReplyNone) return Sent::kHeld;
  if (status == kReplyOk) {
    if (send_file(socket.fd, file.fd, r.size, bytes_sent_)) {
      // Whole when its writer did not rewrite it meanwhile: the header is the one read first
      // (the writer zeroes the footer before any data; the holder checks the footer).
      const std::uint8_t whole = header_of(file.fd) == header ? 1 : 0;
      std::uint8_t final_status = kReplyBadRequest;
      if (send_all(socket.fd, &whole, 1) && (whole == 0 || take(socket.fd, final_status))) {
        if (whole == 0) {
          spdlog::debug(
              "snapshot replicas: rank {}'s step {} was rewritten while it was sent to {}", rank,
              save.stamp.step, peer);
          return Sent::kRewritten;
        }
        if (final_status == kReplyOk) {
          ++saves_sent_;
          spdlog::debug("snapshot replicas: rank {}'s step {} sent to {} ({})", rank,
                        save.stamp.step, peer, megabytes(r.size));
          return Sent::kDelivered;
        }
        if (final_status == kReplyBadRequest && rewritten()) return Sent::kRewritten;
        if (final_status == kReplyBadRequest) {
          spdlog::warn(
              "snapshot replicas: {} refused rank {}'s snapshot {} as not whole or not "
              "this job's rank {}: not sent again",
              peer, rank, save.path.string(), rank);
          return Sent::kRejected;
        }
      }
    }
    if (rewritten()) return Sent::kRewritten;
    why = "the transfer broke off";
  } else if (status == kReplyNoRoom) {
    why = "it has no room for it";
  } else if (status != kNoAnswer) {
    why = "it refused the request";
  }
  if (!said_failed_.contains(peer)) {
    said_failed_.insert(peer);
    spdlog::warn(
        "snapshot replicas: cannot send rank {}'s snapshot to {}: {} (passed over for "
        "{} s)",
        rank, peer, why, kPeerRestPeriod.count());
  }
  return Sent::kFailed;
}

// ---- restoring ----------------------------------------------------------------------------

void SnapshotReplicas::run_restorer() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait(lock, [this] { return stopping_ || !restores_.empty(); });
    if (stopping_) break;
    Restore r = std::move(restores_.front());
    restores_.pop_front();
    const auto endpoint = store_;
    lock.unlock();
    if (endpoint) {
      try {
        if (r.epoch == restore_epoch_.load())
          restore_now(*endpoint, r.ranks, r.other_nodes, r.epoch);
      } catch (const std::exception& e) {
        spdlog::warn("snapshot replicas: cannot restore ranks from peers: {}", e.what());
      }
    }
    r.done();
    lock.lock();
  }
}

// A round's store may be new (an elastic round's workers' store is): the other nodes' agents say
// there what they hold as they join it, which is waited for (within kRegistrationWait).
void SnapshotReplicas::restore_now(const store::Endpoint& endpoint, const std::vector<int>& ranks,
                                   int other_nodes, std::uint64_t epoch) {
  const auto began = Clock::now();
  const auto deadline = began + kRestoreBudget;
  auto session = open_store(endpoint);
  std::string self;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      if (server_) self = server_->endpoint();
    }
    auto servers = lines_of(session->try_get(key("servers")));
    std::erase(servers, self);
    if (static_cast<int>(servers.size()) >= other_nodes) break;
    if (Clock::now() - began > kRegistrationWait) {
      spdlog::warn(
          "snapshot replicas: {} of the {} other nodes' agents said what they hold within "
          "{} s: restoring from those",
          servers.size(), other_nodes, kRegistrationWait.count());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const int rank : ranks) {
    const auto holders = lines_of(session->try_get(key(rank_folder(rank))));
    if (holders.empty()) continue;  // no save of it anywhere yet: a job's first start
    restore_rank(rank, holders, deadline, epoch);
  }
}

bool SnapshotReplicas::restore_rank(int rank, const std::vector<std::string>& holders,
                                    Clock::time_point deadline, std::uint64_t epoch) {
  struct Offer {
    std::string holder;
    std::int64_t saved_at = 0;
    std::uint64_t size = 0;
    std::uint64_t save_id = 0;
  };
  const auto began = Clock::now();
  std::vector<Offer> offers;
  std::vector<std::string> silent;
  for (const auto& holder : holders) {
    if (Clock::now() > deadline) break;
    InFlight connection(*this, holder);
    const Fd& socket = connection.socket;
    std::string why;
    const int status =
        socket ? ask(socket.fd, Request{kStat, options_.job, rank}, options_.secret, why, deadline)
               : kNoAnswer;
    Offer o{holder};
    if (status == kReplyOk && take(socket.fd, o.saved_at, deadline) &&
        take(socket.fd, o.size, deadline) && take(socket.fd, o.save_id, deadline)) {
      offers.push_back(o);
    } else if (status != kReplyNone) {
      silent.push_back(holder);
    }
  }
  std::sort(offers.begin(), offers.end(),
            [](const Offer& a, const Offer& b) { return a.saved_at > b.saved_at; });
  const fs::path folder = snapshots_ / rank_folder(rank);
  for (const auto& o : offers) {
    if (Clock::now() > deadline) break;
    InFlight connection(*this, o.holder);
    const Fd& socket = connection.socket;
    std::string why;
    std::uint64_t size = 0;
    if (!socket ||
        ask(socket.fd, Request{kGet, options_.job, rank}, options_.secret, why, deadline) !=
            kReplyOk ||
        !take(socket.fd, size, deadline) || size > kMaxReplicaBytes) {
      continue;
    }
    std::error_code ec;
    fs::create_directories(folder, ec);
    const fs::path partial = folder / (".tmp.replica." + std::to_string(::getpid()));
    Fd out(::open(partial.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::uint8_t whole = 0;
    const bool received = out && receive_file(socket.fd, out.fd, size, deadline) &&
                          take(socket.fd, whole, deadline) && whole == 1;
    out.reset();
    const auto stamp = received ? read_stamp(partial) : std::nullopt;
    if (!stamp || stamp->job != options_.job || stamp->rank != rank) {
      fs::remove(partial, ec);
      continue;
    }
    // Never over a save of the rank's own, nor for an attempt that is over (its workers may be
    // running another attempt's state by now).
    const fs::path target = folder / snapshot_name(stamp->step);
    const bool current = epoch == restore_epoch_.load();
    if (!current ||
        ::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
      fs::remove(partial, ec);
      if (!current) return false;
      continue;
    }
    bytes_restored_ += size;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count();
    spdlog::info("rank {}: its snapshot of step {} ({}) restored from the agent at {} in {} ms",
                 rank, stamp->step, megabytes(size), o.holder, ms);
    return true;
  }
  if (!silent.empty() || !offers.empty()) {
    std::string names;
    for (const auto& h : silent) names += (names.empty() ? "" : ", ") + h;
    spdlog::warn(
        "rank {}: no replica of its snapshot could be restored{}{}: its workers start "
        "from what --snapshot-dir holds, or from the beginning",
        rank, names.empty() ? "" : " (not answering: ", names.empty() ? "" : names + ")");
  }
  return false;
}

nlohmann::ordered_json SnapshotReplicas::status() const {
  auto held = nlohmann::ordered_json::array();
  std::uint64_t held_bytes = 0;
  std::string endpoint;
  std::uint64_t received = 0;
  {
    std::lock_guard lock(mutex_);
    if (server_) {
      endpoint = server_->endpoint();
      received = server_->bytes_received();
      for (const auto& [rank, save] : server_->held()) {
        std::error_code ec;
        held_bytes += fs::file_size(save.path, ec);
        held.push_back({{"rank", rank}, {"step", save.stamp.step}});
      }
    }
  }
  return {
      {"replicas", options_.replicas},
      {"serving", endpoint.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(endpoint)},
      {"sent_bytes", bytes_sent_.load()},
      {"saves_sent", saves_sent_.load()},
      {"received_bytes", received},
      {"restored_bytes", bytes_restored_.load()},
      {"held_bytes", held_bytes},
      {"held", std::move(held)}};
}

}  // namespace dist::agent::warm
