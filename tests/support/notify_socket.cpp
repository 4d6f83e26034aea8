#include "support/notify_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace mqtt_inbox::test {

bool Notification::has(const std::string& line) const {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l == line) return true;
  return false;
}

std::string Notification::value(const std::string& key) const {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  return "";
}

NotifySocket::NotifySocket(std::string path) : path_(std::move(path)) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof addr.sun_path)
    throw std::runtime_error("socket path too long: " + path_);
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  ::unlink(path_.c_str());
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("cannot bind " + path_ + ": " + why);
  }
  if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    ::close(fd_);
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  }
  reader_ = std::thread([this] { read_loop(); });
}

NotifySocket::~NotifySocket() {
  const char x = 'x';
  (void)!::write(stop_pipe_[1], &x, 1);
  reader_.join();
  ::close(stop_pipe_[0]);
  ::close(stop_pipe_[1]);
  ::close(fd_);
  ::unlink(path_.c_str());
}

void NotifySocket::read_loop() {
  for (;;) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(
          {std::chrono::steady_clock::now(), std::string(buf, static_cast<size_t>(n))});
    }
    cv_.notify_all();
  }
}

bool NotifySocket::wait_for(const std::function<bool(const std::vector<Notification>&)>& done,
                            std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done(received_); });
}

std::vector<Notification> NotifySocket::collect(std::chrono::milliseconds duration) {
  const size_t first = size();
  std::this_thread::sleep_for(duration);
  std::lock_guard<std::mutex> lock(mu_);
  return {received_.begin() + static_cast<std::ptrdiff_t>(first), received_.end()};
}

bool NotifySocket::wait_line(const std::string& line, std::chrono::milliseconds timeout,
                             size_t from) {
  return wait_for(
      [&](const std::vector<Notification>& all) {
        for (size_t i = from; i < all.size(); ++i)
          if (all[i].has(line)) return true;
        return false;
      },
      timeout);
}

bool NotifySocket::wait_status(const std::string& fragment, std::chrono::milliseconds timeout,
                               size_t from) {
  return wait_for(
      [&](const std::vector<Notification>& all) {
        for (size_t i = from; i < all.size(); ++i)
          if (all[i].value("STATUS").find(fragment) != std::string::npos) return true;
        return false;
      },
      timeout);
}

size_t NotifySocket::count_line(const std::string& line, size_t from) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (size_t i = from; i < received_.size(); ++i)
    if (received_[i].has(line)) ++n;
  return n;
}

std::vector<Notification> NotifySocket::received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

size_t NotifySocket::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_.size();
}

std::string NotifySocket::dump() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& n : received_) out += n.text + "--\n";
  return out;
}

}  // namespace mqtt_inbox::test
