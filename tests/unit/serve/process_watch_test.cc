#include "serve/process_watch.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "base/clock.h"

namespace xds::serve {
namespace {

// Polls until `watch` reports something (at most 10 s).
std::string wait_for_death(const ProcessWatch& watch) {
  const int64_t deadline = now_ns() + 10'000'000'000;
  std::string d;
  while ((d = watch.deaths()).empty() && now_ns() < deadline) usleep(1000);
  return d;
}

TEST(ProcessWatch, NamesAnExitCodeAndASignalWithoutReaping) {
  const pid_t quits = fork();
  if (quits == 0) _exit(3);
  const pid_t sleeps = fork();
  if (sleeps == 0) {
    pause();
    _exit(0);
  }
  ProcessWatch watch;
  ASSERT_TRUE(watch.add(quits, "DP group 0").ok());
  ASSERT_TRUE(watch.add(sleeps, "DP group 1").ok());
  const std::string first = wait_for_death(watch);
  EXPECT_EQ(first, "DP group 0 (pid " + std::to_string(quits) + ") exited with code 3");
  kill(sleeps, SIGKILL);
  const int64_t deadline = now_ns() + 10'000'000'000;
  std::string both;
  while ((both = watch.deaths()).find("DP group 1") == std::string::npos && now_ns() < deadline) {
    usleep(1000);
  }
  EXPECT_EQ(both, first + "; DP group 1 (pid " + std::to_string(sleeps) +
                      ") was killed by signal 9 (Killed)");
  // Not reaped by the watch: the parent still collects both.
  int st = 0;
  EXPECT_EQ(waitpid(quits, &st, 0), quits);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3);
  EXPECT_EQ(waitpid(sleeps, &st, 0), sleeps);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

TEST(ProcessWatch, NothingWhileEveryoneLives) {
  const pid_t sleeps = fork();
  if (sleeps == 0) {
    pause();
    _exit(0);
  }
  ProcessWatch watch;
  ASSERT_TRUE(watch.add(sleeps, "DP group 0").ok());
  EXPECT_EQ(watch.deaths(), "");
  kill(sleeps, SIGKILL);
  waitpid(sleeps, nullptr, 0);
}

}  // namespace
}  // namespace xds::serve
