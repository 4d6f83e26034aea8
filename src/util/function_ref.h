// FunctionRef: a non-owning reference to a callable, for calls that run a caller's code
// at once and never keep it (the store's "run this on the connection", a handler run).
// Unlike std::function it never allocates, so the per-message path can pass lambdas that
// capture a few references for free.
//
// Thread safety: a value; the callable it refers to must outlive every call through it.
#pragma once

#include <type_traits>
#include <utility>

namespace mqtt_inbox::detail {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT: implicit, as a function parameter type
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace mqtt_inbox::detail
