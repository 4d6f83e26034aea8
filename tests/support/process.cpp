#include "support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace mqtt_inbox::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/mqtt_inbox_test.XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

// The ELF machine field (e_machine, offset 18) of a file, or -1 if it is not ELF.
int elf_machine(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char h[20] = {};
  if (!f.read(reinterpret_cast<char*>(h), sizeof h) || h[0] != 0x7f || h[1] != 'E' || h[2] != 'L' ||
      h[3] != 'F')
    return -1;
  return h[5] == 2 ? (h[18] << 8 | h[19]) : (h[18] | h[19] << 8);  // EI_DATA: 2 = big endian
}

}  // namespace

std::vector<std::string> with_emulator(std::vector<std::string> argv) {
  const char* emu = std::getenv("MQTT_INBOX_TEST_EMULATOR");
  if (!emu || !*emu || argv.empty()) return argv;
  // Under qemu-user, /proc/self/exe is the target binary being emulated. The program to
  // emulate is the first target binary in argv, not only argv[0]: host wrappers such as
  // setpriv, env or timeout exec the word after them, and the kernel cannot run a target
  // binary for them (without binfmt_misc it falls back to /bin/sh and fails).
  const int target = elf_machine("/proc/self/exe");
  auto at = argv.begin();
  while (at != argv.end() && elf_machine(*at) != target) ++at;
  if (at == argv.end()) return argv;  // host tools only
  std::vector<std::string> prefix;
  std::istringstream words(emu);
  for (std::string w; words >> w;) prefix.push_back(w);
  // Idempotent: Child applies it too, so a test that already did must not get the
  // emulator twice (qemu would be asked to run itself: "Invalid ELF image").
  if (!prefix.empty() && std::find(argv.begin(), at, prefix.front()) != at) return argv;
  argv.insert(at, prefix.begin(), prefix.end());
  return argv;
}

bool under_emulator() {
  const char* emu = std::getenv("MQTT_INBOX_TEST_EMULATOR");
  return emu && *emu;
}

Child::Child(std::vector<std::string> argv, const std::string& log_path) {
  argv = with_emulator(std::move(argv));
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    if (!log_path.empty()) {
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    execv(args[0], args.data());
    _exit(127);
  }
}

Child::~Child() {
  if (running()) {
    kill(pid_, SIGKILL);
    wait(std::chrono::seconds(5));
  }
}

void Child::signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

bool Child::running() {
  if (reaped_) return false;
  int st = 0;
  const pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
    return false;
  }
  return r == 0;
}

int Child::wait(std::chrono::milliseconds timeout) {
  if (wait_until([&] { return !running(); }, timeout)) return status_;
  return -1;
}

bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (cond()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("cannot find a free port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

bool port_open(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

namespace {

std::string mosquitto_binary() {
  if (const char* env = std::getenv("MQTT_INBOX_MOSQUITTO")) return env;
  for (const char* p : {"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/usr/bin/mosquitto"})
    if (access(p, X_OK) == 0) return p;
  throw std::runtime_error("mosquitto not found (apt-get install mosquitto)");
}

}  // namespace

Broker::Broker(Config config, std::vector<std::string> extra_listeners)
    : config_(config), extra_listeners_(std::move(extra_listeners)) {
  log_ = dir_.file("mosquitto.log");
  for (int tries = 0; tries < 5; ++tries) {
    port_ = free_port();
    extra_ports_.clear();
    for (size_t i = 0; i < extra_listeners_.size(); ++i) extra_ports_.push_back(free_port());
    try {
      start();
      return;
    } catch (const std::runtime_error&) {
      stop();
    }
  }
  throw std::runtime_error("mosquitto did not start; see " + log_);
}

Broker::~Broker() { stop(); }

void Broker::start() {
  const std::string conf = dir_.file("mosquitto.conf");
  {
    std::ofstream f(conf);
    if (!extra_listeners_.empty()) f << "per_listener_settings true\n";
    f << "listener " << port_ << " 127.0.0.1\n"
      << "allow_anonymous true\n";
    if (config_.max_connections >= 0) f << "max_connections " << config_.max_connections << "\n";
    for (size_t i = 0; i < extra_ports_.size(); ++i)
      f << "listener " << extra_ports_[i] << " 127.0.0.1\n" << extra_listeners_[i] << "\n";
    f << "persistence " << (config_.persistence ? "true" : "false") << "\n"
      << "persistence_location " << dir_.path() << "/\n"
      << "max_queued_messages " << config_.max_queued_messages << "\n"
      << "max_inflight_messages " << config_.max_inflight_messages << "\n"
      << (config_.max_packet_size > 0
              ? "max_packet_size " + std::to_string(config_.max_packet_size) + "\n"
              : std::string())
      << "log_dest file " << log_ << "\n"
      << "log_type all\n"
      << "pid_file " << pid_file() << "\n";
    // Started as root, mosquitto drops to the `mosquitto` user, which cannot write our
    // folder: it would then run without persistence (guarantees.md section 2).
    if (geteuid() == 0) f << "user root\n";
  }
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const int fd = open((log_ + ".stderr").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    const std::string bin = mosquitto_binary();
    execl(bin.c_str(), bin.c_str(), "-c", conf.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (const int p : extra_ports_)
    if (!wait_until([&] { return port_open(p); }, std::chrono::seconds(10)))
      throw std::runtime_error("mosquitto did not open port " + std::to_string(p));
  if (!wait_until([&] { return port_open(port_); }, std::chrono::seconds(10)))
    throw std::runtime_error("mosquitto did not open port " + std::to_string(port_));
}

void Broker::pause() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void Broker::resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

void Broker::reload() {
  if (pid_ > 0) kill(pid_, SIGHUP);
}

void Broker::stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  kill(pid_, SIGCONT);  // a paused broker acts on the SIGTERM only once it runs
  int st = 0;
  for (int i = 0; i < 500 && waitpid(pid_, &st, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (waitpid(pid_, &st, WNOHANG) == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &st, 0);
  }
  pid_ = -1;
}

std::string built_program(const std::string& name) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto dir = std::filesystem::path(self).parent_path();
  for (const auto& candidate :
       {dir / name, dir.parent_path() / "examples" / name, dir.parent_path() / "tools" / name,
        dir.parent_path() / "bench" / name})
    if (std::filesystem::exists(candidate)) return candidate.string();
  throw std::runtime_error("program not built: " + name);
}

}  // namespace mqtt_inbox::test
