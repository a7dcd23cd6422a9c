// What the quantize tests on the shipped model share: a calibration file (Genesis 1, a
// training chapter; never held-out text), the options of a small calibration, and the
// safetensors headers of an output read by hand.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "quant/quantize.h"

namespace xds {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline const std::string kModel = std::string(XDS_SOURCE_DIR) + "/models/kjv-moe-tiny";

inline std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / ("xds_quant_" + name + "_" + std::to_string(::getpid())))
      .string();
}

inline std::string calibration_file() {
  const std::string path = temp("calib.txt");
  std::ofstream f(path);
  f << "Genesis 1\n"
       "1 In the beginning God created the heaven and the earth.\n"
       "2 And the earth was without form, and void; and darkness was upon the face of the deep. "
       "And the Spirit of God moved upon the face of the waters.\n"
       "3 And God said, Let there be light: and there was light.\n"
       "4 And God saw the light, that it was good: and God divided the light from the darkness.\n"
       "5 And God called the light Day, and the darkness he called Night. And the evening and "
       "the morning were the first day.\n"
       "6 And God said, Let there be a firmament in the midst of the waters, and let it divide "
       "the waters from the waters.\n"
       "7 And God made the firmament, and divided the waters which were under the firmament "
       "from the waters which were above the firmament: and it was so.\n"
       "8 And God called the firmament Heaven. And the evening and the morning were the second "
       "day.\n";
  return path;
}

inline QuantizeOptions options(const std::string& out) {
  QuantizeOptions o;
  o.model_dir = kModel;
  o.out_dir = out;
  o.calibration_file = calibration_file();
  o.samples = 2;
  o.window = 96;
  o.threads = 2;
  o.progress = false;
  return o;
}

// name -> {dtype, shape} of every tensor, from the index and each shard's JSON header.
inline std::map<std::string, json> read_headers(const std::string& dir) {
  std::ifstream ix(dir + "/model.safetensors.index.json");
  const json index = json::parse(ix);
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  std::map<std::string, json> out;
  for (const std::string& file : files) {
    std::ifstream f(dir + "/" + file, std::ios::binary);
    uint8_t len[8];
    f.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    std::string text(n, '\0');
    f.read(text.data(), static_cast<std::streamsize>(n));
    const json header = json::parse(text);
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") continue;
      EXPECT_EQ(index["weight_map"][name], file) << name;
      out[name] = v;
    }
  }
  return out;
}

}  // namespace xds
