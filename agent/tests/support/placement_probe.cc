// A worker stand-in for the placement tests: prints "ready <mode> <nodes>" (its memory policy, as
// get_mempolicy reports it after exec) and OMP_NUM_THREADS, then lives until its stdin closes, so
// the test can read its /proc/<pid>/status meanwhile.
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

int main() {
  constexpr unsigned long kMaxNode = 1024 + 1;
  int mode = -1;
  unsigned long nodes[1024 / 64] = {};
  if (::syscall(SYS_get_mempolicy, &mode, nodes, kMaxNode, nullptr, 0UL) != 0) mode = -1;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf("ready %d %lu %s\n", mode, nodes[0], omp ? omp : "-");
  std::fflush(stdout);
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  return 0;
}
