// The choice of OpenBLAS kernel set for CPUs OpenBLAS does not know (blas_core.h), against
// the mapping written out by hand from OpenBLAS 0.3.21's list of x86-64 kernel sets.
#include "kernels/cpu/blas_core.h"

#include <gtest/gtest.h>

namespace xds::kernels {
namespace {

constexpr CpuVectorIsa kAvx2{true, false, false};
constexpr CpuVectorIsa kAvx512{true, true, false};
constexpr CpuVectorIsa kAvx512Bf16{true, true, true};
constexpr CpuVectorIsa kSse{false, false, false};

TEST(BlasCore, FallbackKernelsAreReplacedByTheWidestTheCpuHas) {
  EXPECT_EQ(blas_core_upgrade("Prescott", kAvx512Bf16), "Cooperlake");
  EXPECT_EQ(blas_core_upgrade("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(blas_core_upgrade("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(blas_core_upgrade("Sandybridge", kAvx2), "Haswell");  // AVX without FMA
  EXPECT_EQ(blas_core_upgrade("Nehalem", kAvx512), "SkylakeX");
}

TEST(BlasCore, KnownModelsAndOldCpusKeepOpenBlasChoice) {
  EXPECT_EQ(blas_core_upgrade("Haswell", kAvx512Bf16), "");  // OpenBLAS knew the model
  EXPECT_EQ(blas_core_upgrade("SkylakeX", kAvx512Bf16), "");
  EXPECT_EQ(blas_core_upgrade("Zen", kAvx2), "");
  EXPECT_EQ(blas_core_upgrade("Prescott", kSse), "");  // nothing better to run
}

}  // namespace
}  // namespace xds::kernels
