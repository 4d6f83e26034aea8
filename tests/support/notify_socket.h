// Test support: the service manager's end of sd_notify(3). Binds an AF_UNIX datagram
// socket, as systemd does for a Type=notify unit, and receives what the program under
// test sends to the path in NOTIFY_SOCKET. No systemd needed; the protocol is the real one
// (libsystemd's sd_notify sends one datagram of "KEY=value\n" lines per call).
//
// A thread reads the socket all the time, as systemd does. It must: a datagram socket
// queues at most net.unix.max_dgram_qlen (10) datagrams, and past that sd_notify blocks
// the sender (a notifier thread, and with it a destructor waiting for that thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mqtt_inbox::test {

struct Notification {
  std::chrono::steady_clock::time_point at;         // when it was received
  std::string text;                                 // the datagram, e.g. "WATCHDOG=1\nSTATUS=...\n"
  bool has(const std::string& line) const;          // one of its lines is exactly `line`
  std::string value(const std::string& key) const;  // "" if the key is absent
};

class NotifySocket {
 public:
  // Binds `path` (at most 107 bytes; removed first if it exists) and starts reading.
  explicit NotifySocket(std::string path);
  ~NotifySocket();
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;
  const std::string& path() const { return path_; }

  // Waits until `done(all received so far)` is true or `timeout` passed; returns whether
  // `done` became true. `done` runs under the socket's lock.
  bool wait_for(const std::function<bool(const std::vector<Notification>&)>& done,
                std::chrono::milliseconds timeout);
  // Waits for `duration` and returns what arrived in that time.
  std::vector<Notification> collect(std::chrono::milliseconds duration);
  // True once a datagram holding the line `line` arrived (waiting up to `timeout`);
  // datagrams before index `from` of received() do not count.
  bool wait_line(const std::string& line, std::chrono::milliseconds timeout, size_t from = 0);
  // True once a datagram whose STATUS= holds `fragment` arrived (from index `from` on).
  bool wait_status(const std::string& fragment, std::chrono::milliseconds timeout, size_t from = 0);
  // How many datagrams from index `from` on hold the line `line`.
  size_t count_line(const std::string& line, size_t from = 0) const;

  // A copy of everything received so far, in order.
  std::vector<Notification> received() const;
  size_t size() const;
  // Everything received so far, one datagram per paragraph (for failure messages).
  std::string dump() const;

 private:
  void read_loop();
  std::string path_;
  int fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Notification> received_;
  std::thread reader_;
};

}  // namespace mqtt_inbox::test
