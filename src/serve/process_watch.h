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

class ProcessWatch {
 public:
  ProcessWatch() = default;
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;
  ~ProcessWatch();

  // Watches `pid` (a child of this process), named `what` in the failure ("DP group 1").
  Status add(pid_t pid, std::string what);
  // Empty while every watched process lives; else each dead one, "WHAT (pid P) exited with
  // code C" or "WHAT (pid P) was killed by signal S (NAME)", joined by "; " (a killed device's
  // peers often exit on their own right after it). Reaps none of them.
  std::string deaths() const;

 private:
  struct Entry {
    pid_t pid;
    int pidfd;
    std::string what;
  };
  std::vector<Entry> entries_;
};

}  // namespace xds::serve
