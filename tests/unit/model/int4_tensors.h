// The 4-bit checkpoint tensors the model tests write themselves (model/int4_weights.h's
// layouts, from their definitions: compressed-tensors pack-quantized, 8 nibbles per int32,
// weights along the inputs, zero points along the outputs; GPTQ, weights along the inputs in
// [in/8, out], zero points stored minus 1 in v1 along the outputs), shared by
// int4_unpack_test.cc and int4_actorder_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/quant_config.h"
#include "test_files.h"

namespace xds::int4_test {

// A tensor as this test writes it: dtype text, shape, raw little-endian bytes.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline std::string safetensors_of(const std::vector<RawTensor>& ts) {
  std::string header = "{", data;
  for (size_t i = 0; i < ts.size(); ++i) {
    const RawTensor& t = ts[i];
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d)
      shape += (d ? "," : "") + std::to_string(t.shape[d]);
    header += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          i ? "," : "", t.name, t.dtype, shape, data.size(),
                          data.size() + t.bytes.size());
    data += t.bytes;
  }
  return testing::safetensors_bytes(header + "}", data);
}

// The values a module holds, before packing: q [rows][cols] 0..15, scale [rows][groups]
// (multiples of 2^-10, exact in f16 and f32), zero [rows][groups] 0..15 (8 if symmetric).
// g_idx [cols] the group of each column (written as <m>.weight_g_idx / <m>.g_idx); empty:
// column c in group c / group (pack-quantized: no g_idx tensor).
struct Values {
  int64_t rows, cols, group;
  std::vector<uint8_t> q, zero;
  std::vector<float> scale;
  std::vector<int32_t> g_idx = {};

  int64_t group_of(int64_t c) const { return g_idx.empty() ? c / group : g_idx[c]; }
};

// Activation-order groups as GPTQ forms them: the columns shuffled (seeded), group g the
// columns at positions [g·group, (g+1)·group) of the shuffle.
inline std::vector<int32_t> shuffled_groups(int64_t cols, int64_t group, uint32_t seed) {
  std::vector<int32_t> order(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) order[c] = static_cast<int32_t>(c);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> g_idx(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) g_idx[order[j]] = static_cast<int32_t>(j / group);
  return g_idx;
}

inline Values random_values(int64_t rows, int64_t cols, int64_t group, bool symmetric, bool gptq_v1,
                            uint32_t seed) {
  std::mt19937 rng(seed);
  Values v{rows, cols, group, {}, {}, {}, {}};
  const int64_t groups = cols / group;
  for (int64_t i = 0; i < rows * cols; ++i) v.q.push_back(static_cast<uint8_t>(rng() % 16));
  for (int64_t i = 0; i < rows * groups; ++i) {
    v.scale.push_back(static_cast<float>(1 + rng() % 1000) / 1024.0f);
    // GPTQ v1 stores z - 1: zero points 1..15 only.
    v.zero.push_back(symmetric ? 8 : static_cast<uint8_t>(gptq_v1 ? 1 + rng() % 15 : rng() % 16));
  }
  return v;
}

inline std::string i32_bytes(const std::vector<uint32_t>& words) {
  return testing::le_bytes(words);
}

inline std::string f32_bytes(const std::vector<float>& v) {
  return testing::le_bytes(v);
}

// compressed-tensors pack-quantized: word [r][c / 8] holds q[r][c] at bits 4 (c % 8).
inline std::vector<RawTensor> pack_quantized_tensors(const std::string& m, const Values& v,
                                                     bool symmetric) {
  const int64_t groups = v.cols / v.group;
  std::vector<uint32_t> packed(static_cast<size_t>(v.rows * v.cols / 8), 0);
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t c = 0; c < v.cols; ++c)
      packed[r * (v.cols / 8) + c / 8] |= uint32_t{v.q[r * v.cols + c]} << (4 * (c % 8));
  std::vector<RawTensor> ts = {
      {m + ".weight_packed", "I32", {v.rows, v.cols / 8}, i32_bytes(packed)},
      {m + ".weight_scale", "F32", {v.rows, groups}, f32_bytes(v.scale)},
      {m + ".weight_shape", "I64", {2}, testing::le_bytes(std::vector<int64_t>{v.rows, v.cols})}};
  if (!symmetric) {
    // Zero points: word [r / 8][g] holds z[r][g] at bits 4 (r % 8).
    std::vector<uint32_t> zp(static_cast<size_t>((v.rows + 7) / 8 * groups), 0);
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t g = 0; g < groups; ++g)
        zp[(r / 8) * groups + g] |= uint32_t{v.zero[r * groups + g]} << (4 * (r % 8));
    ts.push_back({m + ".weight_zero_point", "I32", {(v.rows + 7) / 8, groups}, i32_bytes(zp)});
  }
  if (!v.g_idx.empty())
    ts.push_back({m + ".weight_g_idx", "I32", {v.cols}, testing::le_bytes(v.g_idx)});
  return ts;
}

// GPTQ: qweight word [c / 8][r] holds q[r][c] at bits 4 (c % 8); qzeros word [g][r / 8]
// holds z[r][g] - 1 (v1) at bits 4 (r % 8); scales [g][r] F32 here.
inline std::vector<RawTensor> gptq_tensors(const std::string& m, const Values& v, bool v1) {
  const int64_t groups = v.cols / v.group, zc = (v.rows + 7) / 8;
  std::vector<uint32_t> qw(static_cast<size_t>(v.cols / 8 * v.rows), 0);
  for (int64_t r = 0; r < v.rows; ++r)
    for (int64_t c = 0; c < v.cols; ++c)
      qw[(c / 8) * v.rows + r] |= uint32_t{v.q[r * v.cols + c]} << (4 * (c % 8));
  std::vector<uint32_t> qz(static_cast<size_t>(groups * zc), 0);
  std::vector<float> sc(static_cast<size_t>(groups * v.rows));
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      qz[g * zc + r / 8] |= uint32_t(v.zero[r * groups + g] - (v1 ? 1 : 0)) << (4 * (r % 8));
      sc[g * v.rows + r] = v.scale[r * groups + g];
    }
  }
  std::vector<int32_t> g_idx;
  for (int64_t c = 0; c < v.cols; ++c) g_idx.push_back(static_cast<int32_t>(v.group_of(c)));
  return {{m + ".qweight", "I32", {v.cols / 8, v.rows}, i32_bytes(qw)},
          {m + ".qzeros", "I32", {groups, zc}, i32_bytes(qz)},
          {m + ".scales", "F32", {groups, v.rows}, f32_bytes(sc)},
          {m + ".g_idx", "I32", {v.cols}, testing::le_bytes(g_idx)}};
}

inline IntQuantization quant_of(Int4Format f, int64_t group, bool symmetric, bool v1 = true) {
  IntQuantization q;
  q.scheme = IntScheme::kW4A16;
  q.format = f;
  q.group_size = group;
  q.symmetric = symmetric;
  q.gptq_zero_minus_one = f == Int4Format::kGptq && v1;
  q.quantized_by_tensors = f == Int4Format::kGptq;
  return q;
}

}  // namespace xds::int4_test
