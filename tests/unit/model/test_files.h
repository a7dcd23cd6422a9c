// Test helpers: a per-test temporary directory and hand-built safetensors bytes (the header
// text is written by the test itself, not by our writer).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace xds::testing {

// [u64 LE header length][header][data]; the header is padded with spaces so that the data
// area starts 8-byte aligned, as the reference writer does.
inline std::string safetensors_bytes(std::string header, const std::string& data) {
  while (header.size() % 8 != 0) header += ' ';
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

template <typename T>
std::string le_bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  std::memcpy(s.data(), v.data(), s.size());  // the test machines are little endian
  return s;
}

// For mutation tests: one run of decimal digits in `text`, chosen by rng, replaced by one of
// `numbers` (chosen by rng too); no change when text has no digit. Draws are
// uniform_int_distribution<size_t>(0, n - 1), run first, then number.
inline void replace_a_digit_run(std::string& text, std::mt19937& rng,
                                std::span<const char* const> numbers) {
  std::vector<std::pair<size_t, size_t>> runs;  // (start, length)
  for (size_t i = 0; i < text.size();) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    runs.emplace_back(i, j - i);
    i = j;
  }
  if (runs.empty()) return;
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const auto [at, len] = runs[pick(runs.size())];
  text.replace(at, len, numbers[pick(numbers.size())]);
}

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("xds_model_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string dir() const { return dir_.string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  std::filesystem::path dir_;
};

}  // namespace xds::testing
