// Runs blocking calls (the store client's) one at a time, in order, on a thread of their own, so
// that the agent's io thread, which may be serving the store those calls go to, never blocks.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace dist::agent {

class BlockingCalls {
 public:
  BlockingCalls() : thread_([this] { loop(); }) {}
  ~BlockingCalls() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  BlockingCalls(const BlockingCalls&) = delete;
  BlockingCalls& operator=(const BlockingCalls&) = delete;

  void run(std::function<void()> call) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(call));
    }
    ready_.notify_one();
  }

 private:
  void loop() {
    while (true) {
      std::function<void()> call;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        call = std::move(queue_.front());
        queue_.pop_front();
      }
      call();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dist::agent
