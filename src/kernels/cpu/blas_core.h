// Which OpenBLAS kernels this process runs, and a correction for CPUs OpenBLAS does not know.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernel set by CPU model when the
// library loads. Version 0.3.21 (Debian 12) does not know some newer models, e.g. Sapphire
// Rapids, and falls back to "Prescott": SSE3 kernels, several times slower than the AVX-512
// ones on the prefill's attention sgemms (docs/benchmarks.md). The
// environment variable OPENBLAS_CORETYPE overrides the choice, but it is read only while the
// library loads, before main(); so main() calls select_blas_core first.
#pragma once

#include <string>
#include <string_view>

namespace xds::kernels {

// OpenBLAS's name for the kernel set in use ("Cooperlake", "SkylakeX", "Haswell", "Zen", ...).
std::string blas_core_name();

// The vector instructions of a CPU, as far as the choice of OpenBLAS kernels goes.
struct CpuVectorIsa {
  bool avx2_fma = false;
  bool avx512 = false;  // F, VL, BW and DQ
  bool avx512_bf16 = false;
};
CpuVectorIsa this_cpu_vector_isa();

// The kernel set `cpu` calls for when OpenBLAS chose `current`, one for CPUs without AVX2
// (its fallback for unknown models): AVX-512 with BF16 → "Cooperlake", AVX-512 →
// "SkylakeX", AVX2 + FMA → "Haswell". Empty when `current` is a kernel set of the AVX2 era
// or later (a model OpenBLAS knows; its choice stands) or the CPU has nothing better.
std::string blas_core_upgrade(std::string_view current, const CpuVectorIsa& cpu);

// blas_core_upgrade for this process; empty also when the user chose (OPENBLAS_CORETYPE).
std::string blas_core_upgrade();

// If blas_core_upgrade() names a kernel set: sets OPENBLAS_CORETYPE to it and re-executes
// this program with the same arguments (the variable, now set, ends the recursion); returns
// only when nothing needs to change or the re-execution failed (then it says so on stderr
// and the process goes on with the slower kernels).
void select_blas_core(char** argv);

}  // namespace xds::kernels
