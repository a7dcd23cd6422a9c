// The processes of an instance (DP groups, output processes) watched through pidfds, so that
// the shell notices a death within one loop and fails the instance cleanly instead of leaving
// requests waiting for tokens that will never come.
//
// Thread-safety: not thread-safe; the shell's thread polls it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"

namespace xds::serve {

// A watched process found dead: its DP group (-1 for another process) and what happened.
struct ProcessDeath {
  int32_t group = -1;
  std::string what;
};

class ProcessWatch {
 public:
  ProcessWatch() = default;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;
  ~ProcessWatch();

  // Watches `pid` (a child of this process), named `what` in the failure ("DP group 1");
  // `group`: the DP group it is (-1: another process).
  Status add(pid_t pid, std::string what, int32_t group = -1);
  // Empty while every watched process lives; else each dead one, "WHAT (pid P) exited with
  // code C" or "WHAT (pid P) was killed by signal S (NAME)", joined by "; " (a killed device's
  // peers often exit on their own right after it). Reaps none of them.
  std::string deaths() const;
  // DP group `group` runs again as `pid` (a rejoin): watched from now on instead of the dead one.
  Status replace(int32_t group, pid_t pid);
  // The same, one entry per dead process.
  std::vector<ProcessDeath> dead() const;

 private:
  struct Entry {
    pid_t pid;
    int pidfd;
    std::string what;
    int32_t group;
  };
  std::vector<Entry> entries_;
};

}  // namespace xds::serve
