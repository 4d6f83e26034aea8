/* nodelay_preload: an LD_PRELOAD shim for the latency investigation only. It sets
 * TCP_NODELAY on every TCP socket right after connect(), which Paho C (1.3.12) never
 * does. Comparing a run with and without it shows what Nagle's algorithm costs on the
 * PUBLISH/PUBACK path:
 *   LD_PRELOAD=build-bench/bench/libnodelay_preload.so bench_consumer ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

int connect(int fd, const struct sockaddr* addr, socklen_t len) {
  static int (*real_connect)(int, const struct sockaddr*, socklen_t) = 0;
  if (!real_connect)
    real_connect = (int (*)(int, const struct sockaddr*, socklen_t))dlsym(RTLD_NEXT, "connect");
  if (addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  }
  return real_connect(fd, addr, len);
}
