// The shards read back by the project's safetensors reader and their headers parsed by hand.
#include "quant/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "model/safetensors.h"

namespace xds {
namespace {

OutTensor tensor(const std::string& name, DType dt, std::vector<int64_t> shape, uint8_t fill) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  OutTensor t{name, dt, shape, std::vector<std::byte>(static_cast<size_t>(n * dtype_size(dt)))};
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = std::byte(fill + i);
  return t;
}

TEST(CheckpointWriter, ShardsIndexAndBytes) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("xds_ckw_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<OutTensor> ts = {tensor("a.weight", DType::kI8, {4, 8}, 1),
                                     tensor("a.weight_scale", DType::kBF16, {4, 1}, 2),
                                     tensor("b.weight", DType::kF32, {3, 5}, 3)};
  ASSERT_TRUE(write_sharded_safetensors(dir, ts, 48).ok());  // 32 + 8 | 60
  std::ifstream in(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 100);
  EXPECT_EQ(index["weight_map"]["a.weight"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["a.weight_scale"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["b.weight"], "model-00002-of-00002.safetensors");
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  for (const OutTensor& t : ts) {
    const TensorView* v = ck->find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), v->nbytes), 0) << t.name;
  }
  // The header by hand: 8-byte little-endian length, JSON padded to a multiple of 8.
  std::ifstream f(dir + "/model-00001-of-00002.safetensors", std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const auto h = nlohmann::json::parse(header);
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["a.weight_scale"]["data_offsets"], (std::vector<int>{32, 40}));
  std::filesystem::remove_all(dir);
}

TEST(CheckpointWriter, RefusesABadByteCount) {
  OutTensor t = tensor("x", DType::kF32, {2, 2}, 0);
  t.bytes.pop_back();
  const Status s = write_sharded_safetensors("/nonexistent-dir-for-test", {t}, 1 << 20);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace xds
