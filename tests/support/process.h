// Test support: temporary folders, child processes and a real mosquitto broker.
// No mocks: tests run against a real broker on 127.0.0.1 and real SQLite files.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace mqtt_inbox::test {

// A fresh folder under $TMPDIR (or /tmp), removed with its content on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// In a cross build (ctest sets MQTT_INBOX_TEST_EMULATOR to CMAKE_CROSSCOMPILING_EMULATOR),
// puts the emulator in front of the first word of `argv` that is a target binary (the same
// ELF machine as this test), so built programs run under qemu, also behind host wrappers
// (setpriv, env, timeout), while host tools (sqlite3) run natively.
// Otherwise returns `argv` unchanged.
std::vector<std::string> with_emulator(std::vector<std::string> argv);

// True when the tests run under an emulator (a cross build's ctest under qemu-user):
// MQTT_INBOX_TEST_EMULATOR is set. For the few tests that cannot work there; each says why.
bool under_emulator();

// A child process started with execv. Killed (SIGKILL) on destruction if still running.
class Child {
 public:
  // argv[0] is the program path. stdout/stderr go to `log_path` if given.
  explicit Child(std::vector<std::string> argv, const std::string& log_path = "");
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig);
  // Waits for exit; returns the raw wait status, or -1 on timeout.
  int wait(std::chrono::milliseconds timeout);
  bool running();

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// Polls `cond` every 20 ms until it is true or `timeout` passed; returns its last value.
bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout);

// A free TCP port on 127.0.0.1 (bound to port 0, then released).
int free_port();
// True if something accepts TCP connections on 127.0.0.1:port.
bool port_open(int port);

// A mosquitto broker on 127.0.0.1:<free port>, configured as the guarantee needs
// (guarantees.md section 2): persistence on, no queue limit, and `user root` when run as
// root so that persistence stays writable. Stopped on destruction.
class Broker {
 public:
  struct Config {
    bool persistence = true;
    int max_queued_messages = 0;  // 0 = unlimited
    // QoS 1 messages in flight per client, each way; MQTT 5 clients get it as the
    // CONNACK's Receive Maximum. mosquitto's default is 20.
    int max_inflight_messages = 20;
    // Largest packet the broker accepts, bytes, announced to MQTT 5 clients in CONNACK
    // (Maximum Packet Size); a client that sends a larger one is disconnected. 0 = not
    // set (mosquitto's default: no limit).
    int max_packet_size = 0;
    // Clients the main listener accepts at once; a further CONNECT's socket is closed.
    // -1 = no limit (mosquitto's default).
    int max_connections = -1;
  };
  Broker() : Broker(Config{}) {}
  // `extra_listeners`: more listeners on 127.0.0.1, each on a free port of its own
  // (listener_port(i)); each entry is the configuration lines that follow its "listener
  // PORT" line (TLS files, password_file, require_certificate, ...). With any of them the
  // broker runs with per_listener_settings, and the main listener stays anonymous
  // plaintext.
  explicit Broker(Config config, std::vector<std::string> extra_listeners = {});
  ~Broker();

  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  int listener_port(size_t i) const { return extra_ports_.at(i); }
  // Stops gracefully (SIGTERM: mosquitto saves its persistence file) / starts again on
  // the same port with the same persistence folder.
  void stop();
  void start();
  // Freezes the broker (SIGSTOP) / lets it run again (SIGCONT). While frozen its sockets
  // stay open and the kernel still takes what clients write, but nothing is read or
  // acknowledged: a client's publishes stay in flight, deterministically. Keep the pause
  // well under the clients' keep-alive (1.5x keep-alive ends the connection, MQTT 5.0
  // section 3.1.2.10). stop() resumes a frozen broker first.
  void pause();
  void resume();
  // Asks the broker to reload its configuration (SIGHUP, what `systemctl reload mosquitto`
  // and Debian's logrotate send): it reads its password and ACL files again and checks
  // every client's credentials again. Returns at once; mosquitto acts on it in its loop.
  void reload();
  // The running broker's process id (a new one after each start()); -1 when stopped.
  pid_t pid() const { return pid_; }
  // The file where mosquitto writes its process id at each start (pid_file): a command run
  // by another program reaches the broker after a restart too (kill -HUP "$(cat FILE)").
  std::string pid_file() const { return dir_.file("mosquitto.pid"); }
  const std::string& log_path() const { return log_; }

 private:
  Config config_;
  std::vector<std::string> extra_listeners_;
  TempDir dir_;
  int port_ = 0;
  std::vector<int> extra_ports_;
  std::string log_;
  pid_t pid_ = -1;
};

// Path of a program built next to the tests (the examples, tools, benchmarks and test
// helpers), from the directory of the running test binary.
std::string built_program(const std::string& name);

}  // namespace mqtt_inbox::test
