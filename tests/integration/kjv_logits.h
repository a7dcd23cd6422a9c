// Teacher-forced logits of the shipped model (or a quantized copy) on held-out rows, and the
// figures the quantization tests compare them by (w8a8_kjv_test, w4_kjv_test,
// quantize_w4_kjv_test). Needs XDS_SOURCE_DIR.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/deepseek_v3/deepseek_v3.h"

namespace xds::kjv_logits {

// Rows of held-out tokens, each kLen long (tests/conformance/kjv_moe_tiny/tokens.i32).
inline constexpr int64_t kRows = 3, kLen = 64;

inline std::vector<int32_t> heldout_rows() {
  const std::string path =
      std::string(XDS_SOURCE_DIR) + "/tests/conformance/kjv_moe_tiny/tokens.i32";
  std::vector<int32_t> v(static_cast<size_t>(kRows * kLen));
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  EXPECT_TRUE(f.good()) << path;
  return v;
}

// Logits [kRows * kLen, vocab] of the rows, each prefilled alone, the model loaded with `mo`
// on two threads.
inline std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& tokens,
                                    ModelOptions mo = {}) {
  mo.threads = 2;
  auto m = DeepseekV3Model::load(dir, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  std::vector<float> all;
  for (int64_t r = 0; r < kRows; ++r) {
    KvCache cache = (*m)->make_cache(kLen + 16).value();
    const int64_t seq = cache.add_sequence();
    const TokenChunk ch =
        cache.chunk(seq, 0, std::span<const int32_t>(tokens).subspan(r * kLen, kLen), true).value();
    StepOutput out;
    EXPECT_TRUE((*m)->forward({&ch, 1}, cache.storage(), out).ok());
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  }
  return all;
}

// Mean -log p(next token) over every position with a next token; `v` is the vocabulary.
inline double cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& tokens,
                            int64_t v) {
  double sum = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t t = 0; t + 1 < kLen; ++t) {
      const float* row = logits.data() + (r * kLen + t) * v;
      const double mx = *std::max_element(row, row + v);
      double z = 0;
      for (int64_t i = 0; i < v; ++i) z += std::exp(double(row[i]) - mx);
      sum += mx + std::log(z) - double(row[tokens[r * kLen + t + 1]]);
      ++n;
    }
  }
  return sum / static_cast<double>(n);
}

struct Distance {
  double worst_rel = 0;     // max over rows of max |a - b| / max |b|
  double argmax_agree = 0;  // share of rows with the same argmax
};

inline Distance distance(const std::vector<float>& a, const std::vector<float>& b, int64_t v) {
  Distance d;
  const int64_t rows = static_cast<int64_t>(b.size()) / v;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * v;
    const float* y = b.data() + r * v;
    double mx = 0, err = 0;
    for (int64_t i = 0; i < v; ++i) {
      mx = std::max(mx, std::fabs(double(y[i])));
      err = std::max(err, std::fabs(double(x[i]) - double(y[i])));
    }
    d.worst_rel = std::max(d.worst_rel, err / mx);
    agree += std::max_element(x, x + v) - x == std::max_element(y, y + v) - y;
  }
  d.argmax_agree = double(agree) / double(rows);
  return d;
}

}  // namespace xds::kjv_logits
