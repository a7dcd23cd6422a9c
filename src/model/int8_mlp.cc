#include "model/int8_mlp.h"

#include "kernels/cpu/int8_linear.h"
#include "kernels/cpu/int8_matrix.h"

namespace xds {

bool is_int8_mlp(const MlpWeights& w) {
  return kernels::is_int8_matrix(w.gate_proj) && kernels::is_int8_matrix(w.up_proj) &&
         kernels::is_int8_matrix(w.down_proj);
}

void int8_mlp(const MlpWeights& w, const kernels::Int8RowsRef& x, float* out, int64_t ldo,
              Int8MlpScratch& s, ThreadPool* pool) {
  const int64_t n = x.rows, width = w.gate_proj.rows;
  const kernels::Int8PanelsRef gate = kernels::int8_panels_of(w.gate_proj);
  const kernels::Int8PanelsRef up = kernels::int8_panels_of(w.up_proj);
  const kernels::Int8PanelsRef down = kernels::int8_panels_of(w.down_proj);
  s.hq.resize(n, width);
  if (s.h.size() < static_cast<size_t>(n * width)) s.h.resize(static_cast<size_t>(n * width));
  const kernels::Int8Output h{s.h.data(), nullptr, width};
  const kernels::Int8RowsOut hq = s.hq.out();
  const kernels::Int8Output y{out, nullptr, ldo};
  if (pool == nullptr) {
    kernels::int8_gate_up_on_thread(x, {&gate, &up}, h, &hq);
    kernels::int8_linear_on_thread(s.hq.ref(), down, y);
    return;
  }
  kernels::int8_gate_up(x, {&gate, &up}, h, &hq, *pool);
  kernels::int8_linear(s.hq.ref(), down, y, *pool);
}

}  // namespace xds
