// The int8 peak of one of the int8 kernels' paths (kernels/cpu/int8_linear.h), measured:
// int ops (2 per multiply-add) a second on every thread of the pool, from inline-assembly
// loops with no memory traffic (see int8_peak.cc). The roofline of a W8A8 product
// (bench_int8) or step (bench_decode) holds its int8 operations to it.
#pragma once

#include "base/thread_pool.h"
#include "kernels/cpu/int8_linear.h"

namespace xds::bench {

double int8_peak_gops(ThreadPool& pool, kernels::Int8Isa isa);

}  // namespace xds::bench
