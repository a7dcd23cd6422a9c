// The benchmark client's workload: when requests arrive and what they ask for. Pure: the same
// spec and seed give the same arrivals and the same requests on every machine (the random
// draws use SplitMix64 and this file's own transforms, not the standard library's
// distributions, whose output is implementation-defined).
//
// Arrivals:
//   - closed loop: C requests in flight; a new one is sent when one ends (the runner does
//     that; here there is nothing to plan);
//   - Poisson: exponential gaps with mean 1 / rate, the first arrival one gap after 0;
//   - periodic: at start, start + period, start + 2 period, ...
// Several classes (a mix) each have their own arrival process and lengths; their arrivals are
// merged in time order and numbered 0, 1, 2, ... A request's lengths and prompt depend only on
// (seed, class, index), so a request is the same whatever the concurrency or the timing.
//
// Text syntax (flags and --mix):
//   lengths: "128" (fixed), "64-256" (uniform, both ends included), "64:3/128:1" (length:weight
//            pairs, drawn with probability weight / sum of weights);
//   mix:     classes separated by ';', each a ','-separated list of key=value:
//            rate=R (Poisson, requests/s) or period=P (seconds; start=S, default 0),
//            in=LENGTHS, out=LENGTHS; e.g. "rate=1,in=128,out=64;period=60,in=3900,out=32".
//
// Thread-safety: every function is pure; Rng is a value (one per user).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace xds::loadgen {

// SplitMix64: a small, fast generator with a fixed, documented output sequence.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // An independent stream for (seed, a, b): the seed mixed with both keys.
  static Rng keyed(uint64_t seed, uint64_t a, uint64_t b);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform01();
  // Uniform integer in [lo, hi) (hi > lo), without modulo bias.
  int64_t uniform_int(int64_t lo, int64_t hi);
  // Exponential with the given mean: -mean * ln(1 - u).
  double exponential(double mean);

 private:
  uint64_t state_;
};

struct LengthDist {
  enum class Kind { kFixed, kUniform, kWeighted };
  Kind kind = Kind::kFixed;
  int64_t lo = 1;  // kFixed: the length; kUniform: the smallest
  int64_t hi = 1;  // kFixed: == lo; kUniform: the largest (included)
  std::vector<std::pair<int64_t, double>> weighted;  // kWeighted: (length, weight > 0)
};
// `what` names the flag in errors ("--input-len-dist").
Result<LengthDist> parse_length_dist(std::string_view text, std::string_view what);
std::string length_dist_string(const LengthDist& d);
int64_t sample_length(const LengthDist& d, Rng& rng);
int64_t max_length(const LengthDist& d);

enum class ArrivalKind { kClosedLoop, kPoisson, kPeriodic };

struct RequestClass {
  ArrivalKind arrival = ArrivalKind::kClosedLoop;
  double rate = 0;      // kPoisson: requests per second (> 0)
  double period_s = 0;  // kPeriodic: seconds between arrivals (> 0)
  double start_s = 0;   // kPeriodic: the first arrival
  LengthDist input;
  LengthDist output;
};
Result<std::vector<RequestClass>> parse_mix(std::string_view text);

struct PromptSpec {
  bool token_ids = true;  // ids in [id_lo, id_hi); otherwise text of input_len words
  int32_t id_lo = 0;
  int32_t id_hi = 1000;
  // Given prompts (not token ids): request i sends texts[i mod size] instead of random words
  // (its input_len then only records the drawn length).
  std::vector<std::string> texts;
};

struct WorkloadSpec {
  // Closed loop: exactly one class, kClosedLoop. Open loop: one or more kPoisson / kPeriodic.
  std::vector<RequestClass> classes;
  int64_t concurrency = 1;   // closed loop: requests in flight
  int64_t num_requests = 0;  // 0: bounded by duration_s only
  double duration_s = 0;     // 0: bounded by num_requests only; else no request starts after
  uint64_t seed = 0;
  PromptSpec prompt;
};
// Checks the spec (at least one bound, sane rates, lengths and id range); errors name the
// field and the value.
Status validate_workload(const WorkloadSpec& spec);

struct Arrival {
  double time_s = 0;  // planned send time, from the start of the run
  int class_id = 0;
};
// The open loop's arrivals in time order (ties by class), cut to the first num_requests and
// to times < duration_s where those are set. Requires an open-loop, validated spec.
Result<std::vector<Arrival>> open_loop_arrivals(const WorkloadSpec& spec);

struct RequestSpec {
  int64_t index = 0;
  int class_id = 0;
  double arrival_s = 0;  // open loop: the planned send time; closed loop: 0
  int64_t input_len = 0;
  int64_t output_len = 0;           // max_tokens
  std::vector<int32_t> prompt_ids;  // [input_len] with token-id prompts, else empty
  std::string prompt_text;          // input_len words with text prompts, else empty
};
// Request `index` of class `class_id`: lengths and prompt from Rng::keyed(seed, class, index).
RequestSpec make_request(const WorkloadSpec& spec, int class_id, int64_t index, double arrival_s);

}  // namespace xds::loadgen
