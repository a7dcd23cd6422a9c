#include "kernels/cpu/blas_core.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/env.h"

extern "C" char* openblas_get_corename(void);

namespace xds::kernels {
namespace {

// Kernel sets of OpenBLAS 0.3.21 for x86-64 CPUs without AVX2 (or without FMA).
constexpr std::array<std::string_view, 12> kPreAvx2Cores = {
    "Prescott", "Core2",      "Penryn",    "Dunnington", "Nehalem",     "Atom",
    "Katmai",   "Coppermine", "Northwood", "Banias",     "Sandybridge", "Unknown"};

}  // namespace

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

CpuVectorIsa this_cpu_vector_isa() {
  CpuVectorIsa cpu;
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  cpu.avx512_bf16 = cpu.avx512 && __builtin_cpu_supports("avx512bf16");
  return cpu;
}

std::string blas_core_upgrade(std::string_view current, const CpuVectorIsa& cpu) {
  bool older = false;
  for (std::string_view core : kPreAvx2Cores) older = older || current == core;
  if (!older) return "";
  if (cpu.avx512) return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

std::string blas_core_upgrade() {
  if (env::openblas_coretype().has_value()) return "";
  return blas_core_upgrade(blas_core_name(), this_cpu_vector_isa());
}

void select_blas_core(char** argv) {
  const std::string core = blas_core_upgrade();
  if (core.empty()) return;
  if (!env::set_openblas_coretype(core)) return;
  execv("/proc/self/exe", argv);
  // Still here: the re-execution failed; carry on with the kernels OpenBLAS chose.
  std::fprintf(stderr, "note: OpenBLAS runs its %s kernels; re-executing with %s failed: %s\n",
               blas_core_name().c_str(), core.c_str(), std::strerror(errno));
  env::unset_openblas_coretype();
}

}  // namespace xds::kernels
