/* The launch anchor: the least a launcher can do. Forks N children that exec the given command,
 * then waits for all of them.
 *
 *     fork_exec_wait N COMMAND [ARGS...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s N COMMAND [ARGS...]\n", argv[0]);
    return 2;
  }
  const int n = atoi(argv[1]);
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      execvp(argv[2], argv + 2);
      _exit(127);
    }
    if (pid < 0) return 1;
  }
  int status, failed = 0;
  while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  return failed;
}
