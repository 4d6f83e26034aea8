// Test-only: the C tests' replaceable global operator new (alloc_fail.h), so a C test can
// make the Nth C++ allocation inside the library throw std::bad_alloc and check that the
// entry point returns MQTT_INBOX_NOMEM instead of letting the exception cross into C.
// Linked into the test executable only: its definitions replace libstdc++'s for the
// whole program (the library linked statically into it included).
#include "alloc_fail.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<long> countdown{-1};  // < 0: off; 0: the next allocation fails
std::atomic<long> failures{0};

void* allocate(std::size_t n) {
  long c = countdown.load(std::memory_order_relaxed);
  while (c >= 0) {
    if (countdown.compare_exchange_weak(c, c - 1, std::memory_order_relaxed)) {
      if (c == 0) {
        failures.fetch_add(1, std::memory_order_relaxed);
        throw std::bad_alloc();
      }
      break;
    }
  }
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

extern "C" void c_alloc_fail_nth(long n) { countdown.store(n, std::memory_order_relaxed); }
extern "C" void c_alloc_fail_off(void) { countdown.store(-1, std::memory_order_relaxed); }
extern "C" long c_alloc_failures(void) { return failures.load(); }

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
