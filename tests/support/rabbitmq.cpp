#include "support/rabbitmq.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mqtt_inbox::test {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Waits up to `timeout` for our child `pid` to exit; true if it did (reaped).
bool reap(pid_t pid, std::chrono::milliseconds timeout) {
  int st = 0;
  return wait_until([&] { return waitpid(pid, &st, WNOHANG) == pid; }, timeout);
}

// The epmd daemons started with ERL_EPMD_PORT=<port>: the node's own. An epmd outlives
// the node that started it; others' (another port, or the default one) are left alone.
std::vector<pid_t> epmd_on_port(int port) {
  std::vector<pid_t> out;
  const std::string want = "ERL_EPMD_PORT=" + std::to_string(port);
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string base = std::string("/proc/") + e->d_name;
    if (read_file(base + "/comm") != "epmd\n") continue;
    std::istringstream env(read_file(base + "/environ"));
    for (std::string var; std::getline(env, var, '\0');)
      if (var == want) out.push_back(pid);
  }
  closedir(proc);
  return out;
}

}  // namespace

std::string RabbitMq::server_script() {
  if (const char* env = std::getenv("MQTT_INBOX_RABBITMQ_SERVER")) return env;
  const char* path = "/usr/lib/rabbitmq/bin/rabbitmq-server";
  return access(path, X_OK) == 0 ? path : "";
}

RabbitMq::RabbitMq() {
  if (server_script().empty())
    throw std::runtime_error("rabbitmq-server not found (apt-get install rabbitmq-server)");
  node_name_ = "mqtt-inbox-test-" + std::to_string(getpid()) + "@localhost";
  log_dir_ = dir_.file("log");
  amqp_port_ = free_port();
  mqtt_port_ = free_port();
  dist_port_ = free_port();
  epmd_port_ = free_port();
  write_config();
  try {
    start();
  } catch (...) {
    stop();
    for (pid_t p : epmd_on_port(epmd_port_)) kill(p, SIGTERM);
    throw;
  }
}

RabbitMq::~RabbitMq() {
  stop();
  for (pid_t p : epmd_on_port(epmd_port_)) kill(p, SIGTERM);
}

void RabbitMq::write_config() {
  mkdir(log_dir_.c_str(), 0755);
  mkdir(dir_.file("mnesia").c_str(), 0755);
  // Loopback only: the node accepts anonymous MQTT clients (loopback_users = none lets
  // the default user in from 127.0.0.1; nothing listens on another address).
  std::ofstream conf(dir_.file("rabbitmq.conf"));
  conf << "listeners.tcp.1 = 127.0.0.1:" << amqp_port_ << "\n"
       << "mqtt.listeners.tcp.1 = 127.0.0.1:" << mqtt_port_ << "\n"
       << "mqtt.allow_anonymous = true\n"
       << "loopback_users = none\n"
       << "management.tcp.port = 0\n";
  std::ofstream(dir_.file("enabled_plugins")) << "[rabbitmq_mqtt].\n";
}

void RabbitMq::start() {
  const std::string script = server_script();
  const auto t0 = std::chrono::steady_clock::now();
  std::remove(dir_.file("pid").c_str());
  script_pid_ = fork();
  if (script_pid_ < 0) throw std::runtime_error("fork failed");
  if (script_pid_ == 0) {
    setsid();  // its own process group: a signal to the test does not reach it
    const int fd = open((log_dir_ + "/startup.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    const std::string d = dir_.path();
    setenv("RABBITMQ_NODENAME", node_name_.c_str(), 1);
    setenv("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1", 1);
    setenv("RABBITMQ_NODE_PORT", std::to_string(amqp_port_).c_str(), 1);
    setenv("RABBITMQ_DIST_PORT", std::to_string(dist_port_).c_str(), 1);
    setenv("ERL_EPMD_PORT", std::to_string(epmd_port_).c_str(), 1);
    setenv("RABBITMQ_MNESIA_BASE", (d + "/mnesia").c_str(), 1);
    setenv("RABBITMQ_LOG_BASE", log_dir_.c_str(), 1);
    setenv("RABBITMQ_CONFIG_FILE", (d + "/rabbitmq").c_str(), 1);  // ".conf" is implied
    setenv("RABBITMQ_ENABLED_PLUGINS_FILE", (d + "/enabled_plugins").c_str(), 1);
    setenv("RABBITMQ_PID_FILE", (d + "/pid").c_str(), 1);
    setenv("HOME", d.c_str(), 1);  // the Erlang cookie goes here
    execl(script.c_str(), script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  bool exited = false;
  const bool up = wait_until(
      [&] {
        if (waitpid(script_pid_, &st, WNOHANG) == script_pid_) exited = true;
        return exited || port_open(mqtt_port_);
      },
      std::chrono::seconds(180));
  if (exited) script_pid_ = -1;
  if (!up || exited)
    throw std::runtime_error("RabbitMQ node " + node_name_ + " did not open MQTT port " +
                             std::to_string(mqtt_port_) + (exited ? " (it exited)" : "") +
                             "; log:\n" + log_tail());
  last_start_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void RabbitMq::stop() {
  if (script_pid_ <= 0) return;
  // The start script waits for beam.smp, whose pid the node writes to RABBITMQ_PID_FILE.
  // SIGTERM makes the Erlang VM stop the node in order (init:stop), flushing durable
  // queues; the script exits after it.
  const pid_t beam = static_cast<pid_t>(std::atoi(read_file(dir_.file("pid")).c_str()));
  if (beam > 0)
    kill(beam, SIGTERM);
  else
    kill(-script_pid_, SIGTERM);
  if (!reap(script_pid_, std::chrono::seconds(60))) {
    if (beam > 0) kill(beam, SIGKILL);
    kill(-script_pid_, SIGKILL);
    reap(script_pid_, std::chrono::seconds(10));
  }
  script_pid_ = -1;
}

std::string RabbitMq::ctl(const std::vector<std::string>& args) const {
  std::string script = server_script();
  script = script.substr(0, script.rfind('/') + 1) + "rabbitmqctl";
  const std::string out = dir_.file("ctl.out");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    setenv("ERL_EPMD_PORT", std::to_string(epmd_port_).c_str(), 1);
    setenv("HOME", dir_.path().c_str(), 1);  // the Erlang cookie the node uses
    setenv("RABBITMQ_LOG_BASE", log_dir_.c_str(), 1);
    std::vector<std::string> argv{script, "-n", node_name_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    execv(c[0], c.data());
    _exit(127);
  }
  int st = 0;
  const bool done =
      wait_until([&] { return waitpid(pid, &st, WNOHANG) == pid; }, std::chrono::seconds(120));
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    throw std::runtime_error("rabbitmqctl did not finish: " + read_file(out));
  }
  const std::string text = read_file(out);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    throw std::runtime_error("rabbitmqctl failed: " + text);
  return text;
}

std::string RabbitMq::log_tail() const {
  std::string text =
      read_file(log_dir_ + "/startup.log") + read_file(log_dir_ + "/" + node_name_ + ".log");
  return text.size() > 4000 ? text.substr(text.size() - 4000) : text;
}

}  // namespace mqtt_inbox::test
