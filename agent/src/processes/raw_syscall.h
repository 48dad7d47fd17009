// System calls that leave errno alone, for code run in a child that shares the agent's memory while
// the agent runs on (start_process): errno lives in the agent's thread, and glibc's wrappers (and
// syscall(2)) would write it under the agent's feet. The kernel's own result comes back: the call's
// value, or -errno.
#pragma once

#include <cerrno>

#include <unistd.h>

namespace dist::agent {

#if defined(__x86_64__) || defined(__aarch64__)
// The child may run beside the agent (no errno written anywhere).
inline constexpr bool kErrnoFreeSyscalls = true;
#else
inline constexpr bool kErrnoFreeSyscalls = false;
#endif

// Always inlined: the child must not call through a PLT (a lazy binding writes the agent's state).
[[gnu::always_inline]] inline long raw_syscall(long number, long a = 0, long b = 0, long c = 0,
                                               long d = 0, long e = 0) noexcept {
#if defined(__x86_64__)
  long result;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  asm volatile("syscall"
               : "=a"(result)
               : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
               : "rcx", "r11", "memory");
  return result;
#elif defined(__aarch64__)
  register long x8 asm("x8") = number;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  register long x3 asm("x3") = d;
  register long x4 asm("x4") = e;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory", "cc");
  return x0;
#else  // the child runs while the agent waits (vfork): errno may be written
  const long result = ::syscall(number, a, b, c, d, e);
  return result == -1 ? -errno : result;
#endif
}

// A pointer as a system call's argument.
[[gnu::always_inline]] inline long syscall_arg(const void* p) noexcept {
  return reinterpret_cast<long>(p);
}

}  // namespace dist::agent
