// What the two-process integration tests share: a forked child that runs a function and
// exits with its return value, and that child's exit code.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace xds::fixtures {

// Forks; the child runs fn() and exits with what it returns (stderr flushed, no atexit
// handlers, no test framework teardown). Returns the child's pid to the parent.
template <typename Fn>
pid_t fork_child(Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int rc = fn();
    std::fflush(stderr);
    _exit(rc);
  }
  return pid;
}

// The child's exit code, or 128 + the signal that killed it.
inline int wait_child(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace xds::fixtures
