// The Gloo backend: a gloo::rendezvous::Store over our store client, a TCP device on the address
// the other hosts reach (local_address.h), and the collectives on the group's communication thread.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "dist/sdk/process_group.h"
#include "dist/store/errors.h"
#include "local_address.h"
#include "peer_names.h"
#include "progress_slot.h"
#include "tcp_bytes.h"

namespace dist::sdk {
namespace {

// Waits for `keys`, at most `timeout`; with `superseded`, in slices, between which it is asked
// whether the group is still wanted (GroupSuperseded when not).
void wait_unless_superseded(store::StoreClient& store, const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout,
                            const std::function<bool()>& superseded) {
  if (!superseded) return store.wait(keys, timeout);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const bool last = left <= GlooOptions::kSupersededPoll;
    try {
      return store.wait(
          keys, last ? std::max(left, std::chrono::milliseconds(1)) : GlooOptions::kSupersededPoll);
    } catch (const store::StoreError& e) {
      if (e.code() != store::StoreErrc::kTimeout) throw;
      if (last) {  // said of the whole wait, not of its last slice
        throw store::StoreError(store::StoreErrc::kTimeout,
                                "waiting for " + keys.front() + " timed out after " +
                                    std::to_string(timeout.count()) + " ms");
      }
    }
    if (superseded()) {
      throw GroupSuperseded(
          "a later generation of the group was published while this one "
          "waited for " +
          keys.front() + (keys.size() > 1 ? " and more" : ""));
    }
  }
}

// Fault injection for the recovery tests: with DIST_SDK_FAULT=exit-after-publishing in its
// environment, a process exits (code 6) as soon as Gloo has published its rank's addresses, before
// it connects to any peer: a peer dying in the one window of a set-up that nothing else can place
// (each survivor on the listening side of its pair then waits for a connection that never comes).
bool exit_after_publishing() {
  const char* fault = std::getenv("DIST_SDK_FAULT");
  return fault != nullptr && std::string_view(fault) == "exit-after-publishing";
}

// Gloo's rendezvous (each rank publishes its address, reads everyone's) through our store.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(store::StoreClient client, std::string prefix, std::chrono::milliseconds timeout,
               std::function<bool()> superseded)
      : client_(std::move(client)),
        prefix_(std::move(prefix) + "/"),
        timeout_(timeout),
        superseded_(std::move(superseded)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    client_.set(prefix_ + key, std::string(data.begin(), data.end()));
    written_.push_back(prefix_ + key);
    // (Gloo sets two keys: "rank_<rank>", this rank's host, then "<rank>", its addresses.)
    if (key.find_first_not_of("0123456789") == std::string::npos && exit_after_publishing()) {
      static constexpr char kLine[] =
          "dist-sdk: exiting after publishing this rank's addresses (DIST_SDK_FAULT)\n";
      [[maybe_unused]] const auto written = ::write(STDERR_FILENO, kLine, sizeof kLine - 1);
      std::_Exit(6);
    }
  }
  std::vector<char> get(const std::string& key) override {
    if (superseded_) wait({key}, timeout_);  // (in slices: the GET's own wait is one)
    const std::string value = client_.get(prefix_ + key, timeout_);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& k : keys) prefixed.push_back(prefix_ + k);
    wait_unless_superseded(client_, prefixed, timeout, superseded_);
  }
  // The client back, once Gloo is done with the store (connectFullMesh returned).
  store::StoreClient release() { return std::move(client_); }
  // The keys Gloo wrote through this adapter (this rank's addresses: O(size) bytes each).
  const std::vector<std::string>& written() const { return written_; }

 private:
  store::StoreClient client_;
  std::string prefix_;
  std::vector<std::string> written_;
  std::chrono::milliseconds timeout_;
  std::function<bool()> superseded_;
};

// While Gloo connects the mesh: a watch, on a thread of its own, for a later generation
// (GlooOptions::superseded). Gloo's listening side of a pair waits for its peer's connection (five
// times the group's timeout) with no slice to ask in, so a peer that died between publishing its
// addresses and connecting left the set-up waiting that long, and the agent restarted the group.
// Once superseded, the TCP sockets this process opened since the set-up began (listening or
// connected; not the store's) are shut down, again each kSupersededPoll until the set-up is
// over: Gloo's loop fails the pair's wait at once (an accept on a listening socket shut down
// fails). The first look comes one poll in: most set-ups are over by then and never ask. (A TCP
// socket another thread of the program opened during a set-up that is then superseded is shut
// down too: the SDK's own threads open none, and the set-up is given up anyway.)
class MeshWatch {
 public:
  // `before`: the sockets (detail::tcp_sockets) the process had as the set-up began.
  MeshWatch(std::function<bool()> superseded, std::uint16_t store_port,
            const std::vector<detail::TcpSocket>& before)
      : superseded_(std::move(superseded)), store_port_(store_port) {
    for (const auto& socket : before) before_.push_back(socket.inode);
    thread_ = std::thread([this] { watch(); });
  }
  MeshWatch(const MeshWatch&) = delete;
  MeshWatch& operator=(const MeshWatch&) = delete;
  ~MeshWatch() { stop(); }

  // Ends the watch (its thread joined: nothing is shut down after this returns); whether it saw a
  // later generation, the set-up's sockets shut down since. Read after the join, so that a watch
  // firing as the set-up ends is never missed.
  bool stop() {
    {
      std::lock_guard lock(mutex_);
      over_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    return fired_->load();
  }
  // For the set-up's store waits meanwhile: the watch's answer so far (the check's store
  // connection is the watch's alone). Valid after the watch is gone, then for good.
  std::function<bool()> check() const {
    return [fired = fired_] { return fired->load(); };
  }

 private:
  void watch() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, GlooOptions::kSupersededPoll, [this] { return over_; })) {
      if (!fired_->load()) {
        lock.unlock();
        bool later = false;
        try {
          later = superseded_();
        } catch (const std::exception&) {  // the store cannot say now: asked again next time
        }
        lock.lock();
        if (!later || over_) continue;
        fired_->store(true);
      }
      for (const auto& socket : detail::tcp_sockets(store_port_)) {
        if (std::find(before_.begin(), before_.end(), socket.inode) == before_.end()) {
          detail::shut_down(socket);
        }
      }
    }
  }

  std::function<bool()> superseded_;
  std::uint16_t store_port_;
  std::vector<std::uint64_t> before_;  // inodes
  std::mutex mutex_;
  std::condition_variable wake_;
  bool over_ = false;
  std::shared_ptr<std::atomic<bool>> fired_ = std::make_shared<std::atomic<bool>>(false);
  std::thread thread_;  // last: started once the rest is
};

// Which rank listens at an address, as Gloo's errors name a peer ("[127.0.0.1]:8092"): once its
// mesh is connected, every rank appends its own address to one store key; a failing collective
// reads that key once, without waiting, to name the peer its error is about (a peer that died
// before it appended stays unnamed). The same key finds the rank's connections for
// transport_bytes_sent() (read until every rank has appended); the store client is used for
// nothing else.
class PeerDirectory {
 public:
  PeerDirectory(store::StoreClient store, std::string key, int own_rank)
      : store_(std::move(store)), key_(std::move(key)), own_rank_(own_rank) {}

  void publish(const std::string& address) {
    std::lock_guard lock(mutex_);
    own_address_ = address;
    store_.append(key_, std::to_string(own_rank_) + " " + address + "\n");
  }

  // This rank's connections to the `size` - 1 others (Gloo keeps its sockets to itself: they are
  // found by address, those accepted at this rank's address and those made to the others');
  // nullopt while not every rank has published its address (or the store cannot say), empty when
  // they cannot be told apart (more than two ranks in one process): an answer for good.
  std::optional<std::vector<detail::TcpSocket>> sockets(int size) {
    std::vector<std::string> others;
    try {
      std::lock_guard lock(mutex_);
      std::istringstream lines(store_.try_get(key_).value_or(""));
      for (std::string rank, listening; lines >> rank >> listening;) {
        if (rank != std::to_string(own_rank_)) others.push_back(listening);
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
    const auto expected = static_cast<std::size_t>(size - 1);
    if (others.size() != expected) return std::nullopt;
    auto found = detail::tcp_sockets_of(own_address_, others);
    if (found.size() != expected) found.clear();
    return found;
  }

  // Deletes the directory's key, once the group is gone (never throws).
  void forget_directory() { forget({key_}); }

  // Deletes `keys` (never throws: a store that is gone keeps nothing anyway).
  void forget(const std::vector<std::string>& keys) {
    std::lock_guard lock(mutex_);
    for (const auto& key : keys) {
      try {
        store_.delete_key(key);
      } catch (const std::exception&) {
        return;
      }
    }
  }

  // ", peer rank 1 at [127.0.0.1]:8092": see name_peer.
  std::string describe(const std::string& message) {
    std::optional<std::string> published;
    try {
      std::lock_guard lock(mutex_);
      published = store_.try_get(key_);
    } catch (const std::exception&) {  // the store is gone too: the address alone, then
    }
    return detail::name_peer(message, published.value_or(""), own_rank_);
  }

 private:
  std::mutex mutex_;
  store::StoreClient store_;
  std::string key_;
  int own_rank_;
  std::string own_address_;
};

// A rank listening on a loopback address cannot be reached from another host. When some ranks
// chose one and others did not, the group spans hosts and would hang until its timeout: say so
// at once, on every rank, each naming the ranks on loopback and the fix, since whichever rank
// fails first is the one the failure report shows. A few plain store requests per rank.
void check_reachable(store::StoreClient& store, const std::string& prefix, int rank, int size,
                     const std::string& address, std::chrono::milliseconds timeout,
                     const std::function<bool()>& superseded) {
  const bool loopback = detail::is_loopback(address);
  // Appended before the count, so the list is whole once every rank has been counted.
  if (loopback) {
    store.append(prefix + "/loopback_ranks", std::to_string(rank) + "@" + address + " ");
  }
  if (store.add(prefix + "/addresses_chosen", 1) == size) store.set(prefix + "/all_chosen", "1");
  wait_unless_superseded(store, {prefix + "/all_chosen"}, timeout, superseded);
  std::istringstream list(store.try_get(prefix + "/loopback_ranks").value_or(""));
  int on_loopback = 0;
  std::string named;  // "rank 0 at 127.0.1.1, rank 3 at 127.0.1.1"
  for (std::string entry; list >> entry; ++on_loopback) {
    const auto at = entry.find('@');
    named +=
        (named.empty() ? "rank " : ", rank ") + entry.substr(0, at) + " at " + entry.substr(at + 1);
  }
  if (on_loopback == 0 || on_loopback == size) return;
  const std::string why = "a loopback address the other hosts cannot reach (" +
                          std::to_string(on_loopback) + " of " + std::to_string(size) +
                          " ranks: " + named + ")";
  const std::string fix =
      "/etc/hosts may map MASTER_ADDR or the host's own name to 127.0.1.1; set "
      "GLOO_SOCKET_IFNAME to the interface the other hosts reach, or DIST_LOCAL_ADDR "
      "(dist-launch --local-addr)";
  if (loopback) {
    throw CollectiveError("rank " + std::to_string(rank) + " would listen on " + address + ", " +
                          why + ": this host's " + fix);
  }
  throw CollectiveError("rank " + std::to_string(rank) + " (" + address +
                        ") cannot form the group: some ranks would listen on " + why +
                        ": on their hosts, " + fix);
}

// Calls f(T{}) with T the element type of `type`.
template <typename F>
void with_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
    case DataType::kFloat16:
      return f(Half{});
    case DataType::kBFloat16:
      return f(BFloat16{});
    case DataType::kInt8:
      return f(std::int8_t{});
    case DataType::kUInt8:
      return f(std::uint8_t{});
    case DataType::kInt32:
      return f(std::int32_t{});
    case DataType::kInt64:
      return f(std::int64_t{});
  }
}

template <typename T, typename Op>
void combine(void* out, const void* a, const void* b, std::size_t n, Op op) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if constexpr (is_16bit_float_v<T>) {
    for (std::size_t i = 0; i < n; ++i) {
      o[i] = T::from_float(op(x[i].to_float(), y[i].to_float()));
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
  }
}

template <typename T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  if constexpr (!is_16bit_float_v<T>) {  // Gloo's own kernels for the native types
    using Kernel = void (*)(void*, const void*, const void*, std::size_t);
    switch (op) {
      case ReduceOp::kMin:
        return static_cast<Kernel>(&gloo::min<T>);
      case ReduceOp::kMax:
        return static_cast<Kernel>(&gloo::max<T>);
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return static_cast<Kernel>(&gloo::sum<T>);
    }
  }
  switch (op) {
    case ReduceOp::kMin:
      return [](void* o, const void* a, const void* b, std::size_t n) {
        combine<T>(o, a, b, n, [](auto x, auto y) { return std::min(x, y); });
      };
    case ReduceOp::kMax:
      return [](void* o, const void* a, const void* b, std::size_t n) {
        combine<T>(o, a, b, n, [](auto x, auto y) { return std::max(x, y); });
      };
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // summed, then divided by the group size
      break;
  }
  return [](void* o, const void* a, const void* b, std::size_t n) {
    combine<T>(o, a, b, n, [](auto x, auto y) { return x + y; });
  };
}

template <typename T>
void divide(T* data, std::size_t n, int size) {
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (is_16bit_float_v<T>) {
      data[i] = T::from_float(data[i].to_float() / static_cast<float>(size));
    } else {
      data[i] = static_cast<T>(data[i] / static_cast<T>(size));
    }
  }
}

// Runs tasks one at a time, in submission order, on its own thread.
class CommThread {
 public:
  CommThread() : thread_([this] { run(); }) {}
  ~CommThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  // Runs `task` on the calling thread once everything submitted before has run; tasks submitted
  // meanwhile wait for it. Rethrows what the task throws.
  void run_inline(const std::function<void()>& task) {
    {
      std::unique_lock lock(mutex_);
      idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
      busy_ = true;
    }
    struct Release {
      CommThread* self;
      ~Release() {
        bool queued = false;
        {
          std::lock_guard lock(self->mutex_);
          self->busy_ = false;
          queued = !self->queue_.empty();
        }
        // Wake the communication thread only for work submitted meanwhile: waking it for nothing
        // costs a context switch per collective.
        if (queued) self->ready_.notify_one();
        self->idle_.notify_all();
      }
    } release{this};
    task();
  }

  // The queued task holds a copy of the Work until it ran: what Work::keep_alive() was given
  // lives until then.
  Work submit(std::function<void()> task) {
    auto packaged = std::make_shared<std::packaged_task<void()>>(std::move(task));
    Work work(packaged->get_future().share());
    {
      std::lock_guard lock(mutex_);
      queue_.push_back([packaged, work] { (*packaged)(); });
    }
    ready_.notify_one();
    return work;
  }

 private:
  void run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || (!queue_.empty() && !busy_); });
        if (queue_.empty()) return;  // stopping, and everything issued has run
        task = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      task();
      {
        std::lock_guard lock(mutex_);
        busy_ = false;
      }
      idle_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;  // the communication thread waits for work
  std::condition_variable idle_;   // inline callers wait for the thread to go idle
  bool busy_ = false;              // a task runs (on the thread or inline)
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

class GlooProcessGroup : public ProcessGroup {
 public:
  // `connections`: the sockets of the mesh (those this process opened while it connected);
  // `mesh_keys`: the store keys this rank wrote to connect it, deleted once no rank needs them.
  GlooProcessGroup(std::shared_ptr<gloo::rendezvous::Context> context,
                   std::chrono::milliseconds timeout, std::shared_ptr<PeerDirectory> peers,
                   std::vector<detail::TcpSocket> connections, std::vector<std::string> mesh_keys)
      : context_(std::move(context)),
        timeout_(timeout),
        peers_(std::move(peers)),
        connections_(std::move(connections)),
        mesh_keys_(std::move(mesh_keys)) {}
  // Rank 0 deletes the peers' listening addresses: a job that rebuilds its group leaves no key
  // per generation. One request, bounded by the client's deadline like every store call of the
  // SDK (a store that is gone answers at once: the connection is refused or reset).
  ~GlooProcessGroup() override {
    if (peers_ && rank() == 0) peers_->forget_directory();
  }
  GlooProcessGroup(const GlooProcessGroup&) = delete;
  GlooProcessGroup& operator=(const GlooProcessGroup&) = delete;

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::string backend() const override { return "gloo"; }
  bool device_buffers() const override { return false; }
  // The sum over this rank's connections (one to each peer) of what each socket sent.
  std::optional<std::uint64_t> transport_bytes_sent() const override {
    if (!peers_) return 0;  // a group of one
    std::lock_guard lock(sockets_mutex_);
    if (!sockets_) sockets_ = peers_->sockets(size());  // looked up once it can be answered
    if (!sockets_ || sockets_->empty()) return std::nullopt;
    std::uint64_t total = 0;
    for (const auto& socket : *sockets_) {
      const auto sent = detail::tcp_bytes_sent(socket);
      if (!sent) return std::nullopt;
      total += *sent;
    }
    return total;
  }

  // Every connection of the mesh shut down (not closed: Gloo's pairs own them): Gloo's loop finds
  // them closed and fails what waits on them at once, and every later collective fails before it
  // starts. Gloo keeps its sockets to itself, so they are the ones this process opened while the
  // mesh connected, checked by inode (a descriptor Gloo closed and the process reused is left
  // alone). Under the mutex close_pairs() takes: no pair is closed while they are looked at.
  bool abort(const std::string& why) override {
    std::lock_guard lock(abort_mutex_);
    if (abort_reason_.empty()) abort_reason_ = why.empty() ? "no reason given" : why;
    aborted_.store(true);
    for (const auto& socket : connections_) detail::shut_down(socket);
    return true;
  }

  // Asynchronous: on the communication thread. Synchronous: on the calling thread, once everything
  // issued before has run (no thread hand-off in the common case).
  // Host memory: streams order nothing here.
  Work all_reduce_async(void* data, std::size_t count, DataType type, ReduceOp op,
                        CudaStream) override {
    return submit("all_reduce", all_reduce_body(data, count, type, op));
  }
  void all_reduce(void* data, std::size_t count, DataType type, ReduceOp op, CudaStream) override {
    run_now("all_reduce", all_reduce_body(data, count, type, op));
  }
  Work broadcast_async(void* data, std::size_t count, DataType type, int root,
                       CudaStream) override {
    return submit("broadcast", broadcast_body(data, count, type, root));
  }
  void broadcast(void* data, std::size_t count, DataType type, int root, CudaStream) override {
    run_now("broadcast", broadcast_body(data, count, type, root));
  }
  Work all_gather_async(const void* input, void* output, std::size_t count, DataType type,
                        CudaStream) override {
    return submit("all_gather", all_gather_body(input, output, count, type));
  }
  void all_gather(const void* input, void* output, std::size_t count, DataType type,
                  CudaStream) override {
    run_now("all_gather", all_gather_body(input, output, count, type));
  }
  Work reduce_scatter_async(const void* input, void* output, std::size_t count, DataType type,
                            ReduceOp op, CudaStream) override {
    return submit("reduce_scatter", reduce_scatter_body(input, output, count, type, op));
  }
  void reduce_scatter(const void* input, void* output, std::size_t count, DataType type,
                      ReduceOp op, CudaStream) override {
    run_now("reduce_scatter", reduce_scatter_body(input, output, count, type, op));
  }
  Work barrier_async() override { return submit("barrier", barrier_body()); }
  void barrier() override { run_now("barrier", barrier_body()); }

  using ProcessGroup::all_gather;
  using ProcessGroup::all_reduce;
  using ProcessGroup::broadcast;
  using ProcessGroup::reduce_scatter;

 private:
  using Body = std::function<void(std::uint32_t tag)>;

  Body all_reduce_body(void* data, std::size_t count, DataType type, ReduceOp op) {
    return [=, this](std::uint32_t tag) {
      with_type(type, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(static_cast<T*>(data), count);
        opts.setReduceFunction(reduce_function<T>(op));
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        gloo::allreduce(opts);
        if (op == ReduceOp::kAvg) divide(static_cast<T*>(data), count, size());
      });
    };
  }

  Body broadcast_body(void* data, std::size_t count, DataType type, int root) {
    check_rank(root, "broadcast root");
    return [=, this](std::uint32_t tag) {
      with_type(type, [&](auto zero) {
        using T = decltype(zero);
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(static_cast<T*>(data), count);
        opts.setRoot(root);
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        gloo::broadcast(opts);
      });
    };
  }

  Body all_gather_body(const void* input, void* output, std::size_t count, DataType type) {
    return [=, this](std::uint32_t tag) {
      with_type(type, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllgatherOptions opts(context_);
        opts.setInput(const_cast<T*>(static_cast<const T*>(input)), count);
        opts.setOutput(static_cast<T*>(output), count * static_cast<std::size_t>(size()));
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        gloo::allgather(opts);
      });
    };
  }

  // All-reduce of the whole input, then this rank's block: correct for every type and op, at
  // twice the bandwidth of a ring reduce-scatter (Gloo 2022 has no options-style reduce-scatter).
  Body reduce_scatter_body(const void* input, void* output, std::size_t count, DataType type,
                           ReduceOp op) {
    return [=, this](std::uint32_t tag) {
      with_type(type, [&](auto zero) {
        using T = decltype(zero);
        const std::size_t total = count * static_cast<std::size_t>(size());
        std::vector<T> whole(static_cast<const T*>(input), static_cast<const T*>(input) + total);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(whole.data(), total);
        opts.setReduceFunction(reduce_function<T>(op));
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        try {
          gloo::allreduce(opts);
        } catch (...) {
          close_pairs();  // before `whole`, which a pair may still be writing, is freed
          throw;
        }
        T* block = whole.data() + count * static_cast<std::size_t>(rank());
        if (op == ReduceOp::kAvg) divide(block, count, size());
        std::copy(block, block + count, static_cast<T*>(output));
      });
    };
  }

  Body barrier_body() {
    return [this](std::uint32_t tag) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    };
  }

  // Every rank issues collectives in the same order, so a counter gives matching tags; a failure
  // becomes a CollectiveError naming the operation, the rank and, when Gloo's error names an
  // address, the peer's rank.
  // Each is counted in the worker's progress slot from its issue to its end (progress_slot.h).
  std::function<void()> task(const char* name, Body body) {
    const std::uint32_t tag = next_tag_++;
    const std::uint64_t sequence = detail::collective_issued(detail::collective_kind(name));
    return [this, name, body = std::move(body), tag, sequence] {
      struct Done {
        std::uint64_t sequence;
        ~Done() { detail::collective_completed(sequence); }
      } done{sequence};
      try {
        if (aborted_.load()) throw std::runtime_error("(not started)");
        body(tag);
      } catch (const std::exception& e) {
        close_pairs();
        throw CollectiveError(failure(name, e.what()));
      }
      if (std::strcmp(name, "broadcast") != 0) forget_mesh_keys();
    };
  }

  // After a collective whose result holds every rank's contribution completed (any but a
  // broadcast, which a rank may end having heard from the root alone), every rank has connected
  // its mesh: the addresses they published to connect it are read by nobody any more.
  // Deleted, so that a job that rebuilds its group (in-place recovery: one group per generation)
  // does not leave O(size^2) bytes in the store each time; "listening" (one line per rank) stays
  // while the group lives, to name peers in errors. One request per key, once per group.
  void forget_mesh_keys() {
    if (mesh_keys_.empty() || !peers_) return;
    peers_->forget(mesh_keys_);
    mesh_keys_.clear();
  }

  // A failed collective's pairs may still be sending from, or receiving into, the caller's
  // memory on Gloo's loop thread. Closing each pair takes the mutex that I/O holds, so once this
  // returns Gloo no longer touches that memory, and the caller may free it. A failed group is
  // unusable (failure() says so) and its pairs close when it is destroyed anyway: closing them
  // here only moves that moment before the error is reported. A live peer still waiting on this
  // rank then fails with "closed by peer" at once, as it would when this rank exits, and this
  // rank's own error, the earlier one, says what went wrong first.
  void close_pairs() noexcept {
    std::lock_guard lock(abort_mutex_);
    for (int r = 0; r < context_->size; ++r) {
      if (r == context_->rank) continue;
      try {
        if (auto& pair = context_->getPair(r)) pair->close();
      } catch (const std::exception&) {  // a pair that failed already: nothing left to order
      }
    }
  }

  std::string failure(const char* name, const std::string& what) const {
    if (aborted_.load()) {
      std::lock_guard lock(abort_mutex_);
      return std::string(name) + " failed on rank " + std::to_string(rank()) + " of " +
             std::to_string(size()) + " (gloo): the group was aborted: " + abort_reason_ +
             "; the group is unusable: make a new one, or exit non-zero so the agent restarts it";
    }
    const std::string peer = peers_ ? peers_->describe(what) : "";
    std::string why = what.empty() ? "Gloo gave no reason" : what;
    if (what.find("closed by peer") != std::string::npos ||
        what.find("reset by peer") != std::string::npos) {
      why += " (the peer exited or crashed: its own error says why)";
    } else if (what.find("Timed out") != std::string::npos) {
      why += " (a peer stopped issuing collectives, or is slower than the timeout)";
    }
    return std::string(name) + " failed on rank " + std::to_string(rank()) + " of " +
           std::to_string(size()) + " (gloo" + peer + "): " + why +
           "; the group is unusable: exit non-zero so the agent restarts it";
  }
  Work submit(const char* name, Body body) { return comm_.submit(task(name, std::move(body))); }
  void run_now(const char* name, Body body) { comm_.run_inline(task(name, std::move(body))); }

  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size()) {
      throw std::invalid_argument(std::string(what) + " " + std::to_string(r) +
                                  " is not a rank of a group of " + std::to_string(size()));
    }
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<PeerDirectory> peers_;  // null for a group of one
  mutable std::mutex sockets_mutex_;
  mutable std::optional<std::vector<detail::TcpSocket>> sockets_;  // transport_bytes_sent()'s
  std::uint32_t next_tag_ = 1;
  std::vector<detail::TcpSocket> connections_;  // the mesh's, for abort()
  std::vector<std::string> mesh_keys_;          // until the first collective completed
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;  // abort_reason_; pairs neither closed nor shut down meanwhile
  std::string abort_reason_;        // the first abort's
  CommThread comm_;                 // last: joined before the context goes
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(store::StoreClient store, int rank, int size,
                                              GlooOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is not in a group of " +
                                std::to_string(size));
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = detail::choose_local_address(options.local_address, options.route_to);
  try {
    check_reachable(store, options.key_prefix, rank, size, attr.hostname, options.timeout,
                    options.superseded);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    detail::note_collective_timeout(options.timeout);
    // The mesh's sockets, for abort(): those this process opened while it connected, but the
    // store's (another thread's client may connect meanwhile; a test's store may be in-process).
    const std::string endpoint = store.endpoint();
    const auto store_port =
        static_cast<std::uint16_t>(std::stoul(endpoint.substr(endpoint.rfind(':') + 1)));
    const auto before = detail::tcp_sockets(store_port);
    std::optional<MeshWatch> watch;
    if (options.superseded) watch.emplace(options.superseded, store_port, before);
    StoreAdapter adapter(std::move(store), options.key_prefix, options.timeout,
                         watch ? watch->check() : nullptr);
    try {
      context->connectFullMesh(adapter, device);
    } catch (const GroupSuperseded&) {
      throw;
    } catch (const std::exception& e) {
      if (!watch || !watch->stop()) throw;
      throw GroupSuperseded(
          "a later generation of the group was published while this one "
          "connected its mesh (" +
          std::string(e.what()) + ")");
    }
    if (watch && watch->stop()) {
      throw GroupSuperseded(
          "a later generation of the group was published as this one's mesh connected");
    }
    std::vector<detail::TcpSocket> connections;
    for (const auto& socket : detail::connected_tcp_sockets(store_port)) {
      const bool old = std::any_of(before.begin(), before.end(),
                                   [&](const auto& b) { return b.inode == socket.inode; });
      if (!old) connections.push_back(socket);
    }
    std::vector<std::string> mesh_keys = adapter.written();
    if (rank == 0) {  // the reachability check's, shared
      for (const char* key : {"/addresses_chosen", "/all_chosen", "/loopback_ranks"}) {
        mesh_keys.push_back(options.key_prefix + key);
      }
    }
    std::shared_ptr<PeerDirectory> peers;
    if (size > 1) {  // every pair listens on the device's address: any pair's is this rank's
      peers = std::make_shared<PeerDirectory>(adapter.release(), options.key_prefix + "/listening",
                                              rank);
      peers->publish(context->getPair(rank == 0 ? 1 : 0)->address().str());
    }
    return std::make_unique<GlooProcessGroup>(std::move(context), options.timeout, std::move(peers),
                                              std::move(connections), std::move(mesh_keys));
  } catch (const GroupSuperseded&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError("cannot build the gloo group (rank " + std::to_string(rank) + " of " +
                          std::to_string(size) + ", local address " + attr.hostname +
                          "): " + e.what());
  }
}

}  // namespace dist::sdk
