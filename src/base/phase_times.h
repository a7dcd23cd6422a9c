// PhaseTimes: wall time spent in named phases of a computation, summed over calls.
//
// For profiling a forward step from the outside (bench_decode --phases): the model times
// its phases into a PhaseTimes the caller hands it, or into nothing (a null pointer costs
// one branch per phase). Phases are timed on the thread that drives the step, around
// whole parallel sections, so the sum of the phases is the step's wall time.
// Thread-safety: one driving thread at a time.
#pragma once

#include <map>
#include <string>

#include "base/clock.h"

namespace xds {

struct PhaseTimes {
  std::map<std::string, double> seconds;  // phase name -> summed wall seconds
  void clear() { seconds.clear(); }
};

// Adds the wall time from construction to destruction to `times->seconds[name]`.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes* times, const char* name) : times_(times), name_(name) {
    if (times_ != nullptr) t0_ = Clock::now();
  }
  ~ScopedPhase() {
    if (times_ != nullptr) times_->seconds[name_] += seconds_since(t0_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimes* times_;
  const char* name_;
  Clock::time_point t0_{};
};

}  // namespace xds
