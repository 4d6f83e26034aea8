#include "support/cut_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace mqtt_inbox::test {

// One forwarded connection. Side 0 is the client, side 1 the upstream server; pending[s]
// holds bytes read from side s that side 1-s has not taken yet.
struct CutProxy::Conn {
  int fd[2] = {-1, -1};
  bool tcp[2] = {false, false};
  std::string pending[2];
  bool eof[2] = {false, false};   // side s closed its sending half
  bool shut[2] = {false, false};  // we closed our sending half towards side s
  std::string tail[2];            // the last bytes read from side s, for patterns across reads
  // A kAfterForwarding trigger matched on side `flush_side`: once its bytes are written,
  // the next bytes from `await_reply_from` cut the connection instead of being forwarded.
  int flush_side = -1;
  int await_reply_from = -1;
  bool closed = false;
};

namespace {

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    throw std::runtime_error("unix socket path too long (" + std::to_string(path.size()) +
                             " bytes; set TMPDIR to a shorter folder): " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

sockaddr_in loopback_address(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// A blocking connect bounded by SO_SNDTIMEO (it applies to connect on TCP and unix sockets),
// so that a server whose backlog is full cannot hold the forwarding thread for long.
int connect_upstream(const CutProxy::Upstream& up) {
  const bool unix_socket = !up.unix_path.empty();
  const int fd = socket(unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int rc;
  if (unix_socket) {
    const sockaddr_un addr = unix_address(up.unix_path);
    rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } else {
    const sockaddr_in addr = loopback_address(up.tcp_port);
    rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  }
  if (rc != 0) {
    close(fd);
    return -1;
  }
  if (!unix_socket) set_nodelay(fd);
  set_nonblocking(fd);
  return fd;
}

// Closes `fd`; with `abort` a TCP socket sends RST instead of FIN (SO_LINGER 0).
void close_socket(int fd, bool tcp, bool abort) {
  if (fd < 0) return;
  if (abort && tcp) {
    const linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  close(fd);
}

}  // namespace

CutProxy::CutProxy(Upstream upstream) : upstream_(std::move(upstream)) {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe2 failed");
  try {
    open_listeners_locked();  // no thread yet: nothing to lock against
  } catch (...) {
    close_listeners_locked();
    close(wake_[0]);
    close(wake_[1]);
    throw;
  }
  thread_ = std::thread(&CutProxy::run, this);
}

CutProxy::~CutProxy() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    ++requested_;
    const char b = 's';
    (void)!write(wake_[1], &b, 1);
  }
  thread_.join();
  close(wake_[0]);
  close(wake_[1]);
  unlink(unix_path().c_str());
}

std::string CutProxy::unix_path() const {
  return dir_.path() + "/.s.PGSQL." + std::to_string(port_);
}

void CutProxy::open_listeners_locked() {
  // TCP first: the port it gets (a free one the first time, the same one after refuse)
  // names the unix socket too.
  tcp_listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  setsockopt(tcp_listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr = loopback_address(port_);
  socklen_t len = sizeof addr;
  if (tcp_listener_ < 0 || bind(tcp_listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(tcp_listener_, 64) != 0 ||
      getsockname(tcp_listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("cut proxy: cannot listen on 127.0.0.1:" + std::to_string(port_) +
                             ": " + std::strerror(errno));
  if (port_ == 0) port_ = ntohs(addr.sin_port);  // set once, before the thread reads it
  const std::string path = unix_path();
  const sockaddr_un uaddr = unix_address(path);
  unlink(path.c_str());
  unix_listener_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (unix_listener_ < 0 ||
      bind(unix_listener_, reinterpret_cast<const sockaddr*>(&uaddr), sizeof uaddr) != 0 ||
      listen(unix_listener_, 64) != 0)
    throw std::runtime_error("cut proxy: cannot listen on " + path + ": " + std::strerror(errno));
}

void CutProxy::close_listeners_locked() {
  // The unix socket's file stays: a connect to it is refused, as to a server that is down.
  for (int* fd : {&tcp_listener_, &unix_listener_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void CutProxy::apply_locked(std::unique_lock<std::mutex>& lock) {
  const unsigned long want = ++requested_;
  const char b = 'a';
  (void)!write(wake_[1], &b, 1);  // a full pipe already holds a wake-up
  cv_.wait(lock, [&] { return applied_ >= want; });
  if (!apply_error_.empty()) {
    const std::string error = std::move(apply_error_);
    apply_error_.clear();
    throw std::runtime_error(error);
  }
}

int CutProxy::cut_all() {
  std::unique_lock<std::mutex> lock(mu_);
  cut_all_requested_ = true;
  apply_locked(lock);
  return last_cut_count_;
}

void CutProxy::refuse(bool on) {
  std::unique_lock<std::mutex> lock(mu_);
  refusing_ = on;
  apply_locked(lock);
}

void CutProxy::freeze(bool on) {
  std::unique_lock<std::mutex> lock(mu_);
  frozen_ = on;
  apply_locked(lock);
}

void CutProxy::cut_when(Direction direction, std::string pattern, When when) {
  if (pattern.empty()) throw std::invalid_argument("cut_when: empty pattern");
  std::unique_lock<std::mutex> lock(mu_);
  armed_ = true;
  trigger_side_ = direction == Direction::kClientToServer ? 0 : 1;
  pattern_ = std::move(pattern);
  when_ = when;
  for (auto& c : conns_) c->tail[0].clear(), c->tail[1].clear();
  apply_locked(lock);
}

int CutProxy::triggers_fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

bool CutProxy::wait_triggers_fired(int at_least, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return fired_ >= at_least; });
}

int CutProxy::connections_accepted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return accepted_;
}

int CutProxy::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(
      std::count_if(conns_.begin(), conns_.end(), [](const auto& c) { return !c->closed; }));
}

void CutProxy::close_conn_locked(Conn& c, bool abort) {
  for (int s : {0, 1}) {
    close_socket(c.fd[s], c.tcp[s], abort);
    c.fd[s] = -1;
  }
  c.closed = true;
}

void CutProxy::accept_locked(int listener) {
  const int cfd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (cfd < 0) return;
  ++accepted_;
  const bool client_tcp = listener == tcp_listener_;
  if (client_tcp) set_nodelay(cfd);
  const int sfd = connect_upstream(upstream_);
  if (sfd < 0) {  // the server is down: so is the connection through us
    close_socket(cfd, client_tcp, true);
    return;
  }
  auto c = std::make_unique<Conn>();
  c->fd[0] = cfd;
  c->fd[1] = sfd;
  c->tcp[0] = client_tcp;
  c->tcp[1] = upstream_.unix_path.empty();
  conns_.push_back(std::move(c));
}

// Writes what side 1-s sent to side s; propagates a half-close once all is written.
void CutProxy::on_writable_locked(Conn& c, int s) {
  std::string& p = c.pending[1 - s];
  while (!p.empty()) {
    const ssize_t n = send(c.fd[s], p.data(), p.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0) {  // side s is gone: so is the connection, abruptly for the other side too
      close_conn_locked(c, true);
      return;
    }
    p.erase(0, static_cast<size_t>(n));
  }
  if (c.flush_side == 1 - s) {
    c.flush_side = -1;
    c.await_reply_from = s;
  }
  if (c.eof[1 - s] && !c.shut[s]) {
    shutdown(c.fd[s], SHUT_WR);
    c.shut[s] = true;
  }
  if (c.eof[0] && c.eof[1] && c.pending[0].empty() && c.pending[1].empty())
    close_conn_locked(c, false);
}

void CutProxy::on_readable_locked(Conn& c, int s) {
  char buf[65536];
  const ssize_t n = recv(c.fd[s], buf, sizeof buf, 0);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    close_conn_locked(c, true);  // a reset from one side is passed on as a reset
    return;
  }
  if (n == 0) {
    c.eof[s] = true;
    on_writable_locked(c, 1 - s);  // passes the half-close on when nothing is pending
    return;
  }
  if (c.await_reply_from == s) {  // the reply to the forwarded pattern: never delivered
    ++fired_;
    close_conn_locked(c, true);
    cv_.notify_all();
    return;
  }
  std::string chunk(buf, static_cast<size_t>(n));
  if (armed_ && s == trigger_side_) {
    const std::string hay = c.tail[s] + chunk;
    if (hay.find(pattern_) != std::string::npos) {
      armed_ = false;
      if (when_ == When::kBeforeForwarding) {
        ++fired_;
        close_conn_locked(c, true);
        cv_.notify_all();
        return;
      }
      c.flush_side = s;
    } else {
      c.tail[s] = hay.substr(hay.size() - std::min(hay.size(), pattern_.size() - 1));
    }
  }
  c.pending[s] += chunk;
  on_writable_locked(c, 1 - s);
}

void CutProxy::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Apply what the control calls asked for, then acknowledge.
    if (cut_all_requested_) {
      int n = 0;
      for (auto& c : conns_)
        if (!c->closed) close_conn_locked(*c, true), ++n;
      last_cut_count_ = n;
      cut_all_requested_ = false;
    }
    conns_.erase(
        std::remove_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->closed; }),
        conns_.end());
    const bool listen_wanted = !refusing_ && !stopping_;
    if (listen_wanted && tcp_listener_ < 0) {
      try {
        open_listeners_locked();
      } catch (const std::exception& e) {
        close_listeners_locked();
        apply_error_ = e.what();
      }
    } else if (!listen_wanted && tcp_listener_ >= 0) {
      close_listeners_locked();
    }
    applied_ = requested_;
    cv_.notify_all();
    if (stopping_) break;

    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
    std::vector<std::pair<Conn*, int>> who{{nullptr, -1}};  // side -1: not a connection
    if (!frozen_) {
      for (int l : {tcp_listener_, unix_listener_})
        if (l >= 0) fds.push_back({l, POLLIN, 0}), who.emplace_back(nullptr, -1);
      for (auto& c : conns_)
        for (int s : {0, 1}) {
          short events = 0;
          if (!c->eof[s] && c->pending[s].empty()) events |= POLLIN;
          if (!c->pending[1 - s].empty()) events |= POLLOUT;
          if (events) fds.push_back({c->fd[s], events, 0}), who.emplace_back(c.get(), s);
        }
    }
    lock.unlock();
    const int ready = poll(fds.data(), fds.size(), -1);
    lock.lock();
    if (ready <= 0) continue;
    if (fds[0].revents) {
      char drain[64];
      while (read(wake_[0], drain, sizeof drain) > 0) {
      }
    }
    // A control call made while we polled is applied (and acknowledged) first: after
    // freeze(true) or refuse(true) returns, nothing more moves or is accepted.
    if (requested_ != applied_) continue;
    for (size_t i = 1; i < fds.size(); ++i) {
      const short ev = fds[i].revents;
      if (!ev) continue;
      Conn* c = who[i].first;
      const int s = who[i].second;
      if (!c) {
        accept_locked(fds[i].fd);
        continue;
      }
      if (c->closed) continue;
      if (ev & POLLERR) {
        close_conn_locked(*c, true);
        continue;
      }
      if (ev & POLLOUT) on_writable_locked(*c, s);
      if (!c->closed && (fds[i].events & POLLIN) && (ev & (POLLIN | POLLHUP)))
        on_readable_locked(*c, s);
      else if (!c->closed && (ev & POLLHUP) && !(fds[i].events & POLLIN))
        on_writable_locked(*c, s);  // the write fails and closes the connection
    }
  }
  for (auto& c : conns_)
    if (!c->closed) close_conn_locked(*c, true);
  conns_.clear();
  close_listeners_locked();
}

}  // namespace mqtt_inbox::test
