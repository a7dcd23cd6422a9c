#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "test_files.h"

namespace xds {
namespace {

using xds::testing::le_bytes;
using xds::testing::safetensors_bytes;

class Safetensors : public xds::testing::TempDirTest {
 protected:
  // Opens dir/<name> after writing `header` + `data` there; returns the error message.
  std::string open_error(const std::string& header, const std::string& data) {
    write("model.safetensors", safetensors_bytes(header, data));
    auto r = SafetensorsFile::open(path("model.safetensors"));
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    EXPECT_NE(r.status().message().find(path("model.safetensors")), std::string::npos)
        << r.status().message();
    return r.status().message();
  }
};

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST_F(Safetensors, ReadsHandBuiltFile) {
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
                             R"("e":{"dtype":"F32","shape":[0,4],"data_offsets":[22,22]}})";
  // BF16 bit patterns by hand: 1.0 = 0x3f80, -3.0 = 0xc040, 2.0 = 0x4000.
  const std::string data =
      le_bytes<float>({1, 2, 3, 4}) + le_bytes<uint16_t>({0x3f80, 0xc040, 0x4000});
  write("model.safetensors", safetensors_bytes(header, data));
  auto r = Checkpoint::open(dir());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Checkpoint& ck = *r;
  EXPECT_EQ(ck.num_tensors(), 3u);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "e"}));
  const TensorView* a = ck.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a->nbytes, 16u);
  EXPECT_EQ(a->numel(), 4);
  EXPECT_EQ(a->file, path("model.safetensors"));
  float f[4];
  std::memcpy(f, a->data, 16);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[3], 4.0f);
  const TensorView* b = ck.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  EXPECT_EQ(b->data, a->data + 16);
  uint16_t h;
  std::memcpy(&h, b->data + 2, 2);
  EXPECT_EQ(bf16_to_f32(h), -3.0f);
  EXPECT_EQ(ck.find("e")->numel(), 0);
  EXPECT_EQ(ck.find("nope"), nullptr);
  EXPECT_EQ(ck.files()[0]->metadata().at("format"), "pt");

  auto ok = ck.require("a", {2, 2});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, a);
}

TEST_F(Safetensors, RequireWrongShapeAndMissingTensor) {
  write("model.safetensors",
        safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                          le_bytes<float>({1, 2, 3, 4})));
  auto r = Checkpoint::open(dir());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto bad = r->require("w", {2, 3});
  ASSERT_FALSE(bad.ok());
  EXPECT_CONTAINS(bad.status().message(), path("model.safetensors"));
  EXPECT_CONTAINS(bad.status().message(), "'w'");
  EXPECT_CONTAINS(bad.status().message(), "expected [2, 3]");
  EXPECT_CONTAINS(bad.status().message(), "found [2, 2]");
  auto missing = r->require("model.norm.weight", {4});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(missing.status().message(), dir());
  EXPECT_CONTAINS(missing.status().message(), "missing tensor 'model.norm.weight'");
  EXPECT_CONTAINS(missing.status().message(), "[4]");
}

TEST_F(Safetensors, TruncatedData) {
  const std::string msg = open_error(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                                     le_bytes<float>({1, 2}));
  EXPECT_CONTAINS(msg, "tensor 'w'");
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(msg, "[0, 16]");
  EXPECT_CONTAINS(msg, "8 bytes");
}

TEST_F(Safetensors, FileShorterThanHeaderLength) {
  write("model.safetensors", std::string("\x05\x00\x00", 3));
  auto r = SafetensorsFile::open(path("model.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "truncated file: 3 bytes");
}

TEST_F(Safetensors, HeaderLengthBeyondFile) {
  std::string bytes = safetensors_bytes(R"({})", "");
  bytes[0] = static_cast<char>(0xe8);  // 1000
  bytes[1] = 0x03;
  write("model.safetensors", bytes);
  auto r = SafetensorsFile::open(path("model.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(r.status().message(),
                  "header length 1000 goes beyond the end of the file (8 bytes");
}

TEST_F(Safetensors, BadHeaderJson) {
  EXPECT_CONTAINS(open_error(R"({"w":{"dtype":"F32",)", ""), "not valid JSON");
  EXPECT_CONTAINS(open_error(R"([1,2])", ""), "expected a JSON object");
  EXPECT_CONTAINS(open_error(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
                  "tensor 'w': bad header: expected a string 'dtype'");
  EXPECT_CONTAINS(open_error(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                             std::string(4, '\0')),
                  "non-negative integer dims");
  EXPECT_CONTAINS(
      open_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", std::string(4, '\0')),
      "'data_offsets' [begin, end]");
  EXPECT_CONTAINS(open_error(R"({"__metadata__":{"a":1}})", ""), "'__metadata__' value 'a'");
}

TEST_F(Safetensors, UnknownDtype) {
  const std::string msg =
      open_error(R"({"w":{"dtype":"F4_E2M1","shape":[2],"data_offsets":[0,1]}})", "\x01");
  EXPECT_CONTAINS(msg, "tensor 'w'");
  EXPECT_CONTAINS(msg, "unknown dtype \"F4_E2M1\"");
}

TEST_F(Safetensors, SizeDoesNotMatchShape) {
  const std::string msg = open_error(
      R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", std::string(10, '\0'));
  EXPECT_CONTAINS(msg, "tensor 'w'");
  EXPECT_CONTAINS(msg, "shape [2, 3] of BF16 needs 12 bytes");
  EXPECT_CONTAINS(msg, "hold 10");
}

TEST_F(Safetensors, OverlappingOffsets) {
  const std::string msg = open_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                     R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                     std::string(24, '\0'));
  EXPECT_CONTAINS(msg, "tensor 'b'");
  EXPECT_CONTAINS(msg, "overlap tensor 'a'");
}

TEST_F(Safetensors, GapAndTrailingBytes) {
  EXPECT_CONTAINS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0')),
      "begin at 4, expected 0");
  EXPECT_CONTAINS(
      open_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(8, '\0')),
      "cover 4 bytes of data but the file holds 8");
}

// The mapping asks the kernel for 2 MB pages before anything touches it (advise_huge_pages):
// the kernel's own record of the mapping, /proc/self/smaps, lists the madvise flag "hg"
// among its VmFlags. Skipped where the kernel has no transparent huge pages.
TEST_F(Safetensors, MappingAsksForHugePages) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage"))
    GTEST_SKIP() << "no transparent huge pages in this kernel";
  write("big.bin", std::string(size_t{5} << 20, 'x'));
  auto m = MappedFile::open(path("big.bin"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const auto start = reinterpret_cast<uintptr_t>(m->data());
  std::ifstream smaps("/proc/self/smaps");
  std::string line, flags;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      in_mapping = lo == start;
    } else if (in_mapping && line.rfind("VmFlags:", 0) == 0) {
      flags = line;
      break;
    }
  }
  ASSERT_FALSE(flags.empty()) << "no smaps entry starts at the mapping";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
}

TEST_F(Safetensors, NoCheckpointInDirectory) {
  auto r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "model.safetensors.index.json");
}

class ShardedCheckpoint : public xds::testing::TempDirTest {
 protected:
  void write_shards() {
    write("model-00001-of-00002.safetensors",
          safetensors_bytes(R"({"x.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                            le_bytes<float>({5, 6})));
    write("model-00002-of-00002.safetensors",
          safetensors_bytes(R"({"y.weight":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                            R"("extra":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}})",
                            le_bytes<uint16_t>({0x4000, 0x3f80})));
  }
};

TEST_F(ShardedCheckpoint, LoadsThroughWeightMap) {
  write_shards();
  write("model.safetensors.index.json", R"({"metadata":{"total_size":10},"weight_map":{)"
                                        R"("x.weight":"model-00001-of-00002.safetensors",)"
                                        R"("y.weight":"model-00002-of-00002.safetensors"}})");
  auto r = Checkpoint::open(dir());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_tensors(), 2u);  // only what the weight map lists
  const TensorView* x = r->find("x.weight");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->file, path("model-00001-of-00002.safetensors"));
  float v;
  std::memcpy(&v, x->data + 4, 4);
  EXPECT_EQ(v, 6.0f);
  const TensorView* y = r->find("y.weight");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(y->file, path("model-00002-of-00002.safetensors"));
  // Moving the checkpoint keeps views valid.
  Checkpoint moved = std::move(r).value();
  EXPECT_EQ(moved.find("y.weight"), y);
}

TEST_F(ShardedCheckpoint, MissingShard) {
  write_shards();
  write("model.safetensors.index.json",
        R"({"weight_map":{"x.weight":"model-00001-of-00002.safetensors",)"
        R"("z.weight":"model-00003-of-00003.safetensors"}})");
  auto r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "model.safetensors.index.json");
  EXPECT_CONTAINS(r.status().message(), "shard 'model-00003-of-00003.safetensors'");
  EXPECT_CONTAINS(r.status().message(), "'z.weight'");
}

TEST_F(ShardedCheckpoint, TensorMissingFromItsShard) {
  write_shards();
  write("model.safetensors.index.json",
        R"({"weight_map":{"x.weight":"model-00001-of-00002.safetensors",)"
        R"("y.weight":"model-00001-of-00002.safetensors"}})");
  auto r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), path("model-00001-of-00002.safetensors"));
  EXPECT_CONTAINS(r.status().message(), "tensor 'y.weight' is listed in");
}

TEST_F(ShardedCheckpoint, BadIndex) {
  write_shards();
  write("model.safetensors.index.json", R"({"metadata":{}})");
  auto r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "field 'weight_map'");
  write("model.safetensors.index.json", R"({"weight_map":{"x":"../etc/passwd"}})");
  r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "weight_map['x']");
  // A NUL ends the name for the OS: "shard\0x" would open "shard".
  write("model.safetensors.index.json",
        R"({"weight_map":{"x.weight":"model-00001-of-00002.safetensors\u0000x"}})");
  r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "weight_map['x.weight']");
}

TEST_F(ShardedCheckpoint, BadShardNamesTheShard) {
  write_shards();
  write("model-00002-of-00002.safetensors", std::string("\x40\x00\x00\x00\x00\x00\x00\x00{", 9));
  write("model.safetensors.index.json",
        R"({"weight_map":{"x.weight":"model-00001-of-00002.safetensors",)"
        R"("y.weight":"model-00002-of-00002.safetensors"}})");
  auto r = Checkpoint::open(dir());
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), path("model-00002-of-00002.safetensors"));
  EXPECT_CONTAINS(r.status().message(), "header length 64");
}

// Seeded mutations of a valid file, a few thousand of them: byte changes (mostly in the
// header), truncations, digit runs replaced by out-of-range numbers, dtypes swapped, the
// header length changed, JSON punctuation dropped or inserted. Every case must end cleanly:
// an error naming the file, or a file whose tensors the test finds consistent on its own
// terms (bytes = product of the shape × the dtype's size, recomputed here with overflow
// checks; tensors disjoint and inside the file's data area). A crash, a hang or a read past
// the mapping fails the test (under ASan and UBSan in the test build).
class SafetensorsMutations : public Safetensors {
 protected:
  static std::string base_header() {
    return R"({"__metadata__":{"format":"pt"},)"
           R"("w":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]},)"
           R"("b":{"dtype":"BF16","shape":[7],"data_offsets":[60,74]},)"
           R"("h":{"dtype":"F16","shape":[2,2],"data_offsets":[74,82]},)"
           R"("q":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[82,98]},)"
           R"("s":{"dtype":"F32","shape":[1],"data_offsets":[98,102]}})";
  }
  static std::string base_data() {
    std::string d(102, '\0');
    for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<char>(i * 7 + 1);
    return d;
  }

  // One mutation of `header` (kinds 2-5) or of the whole file (`bytes`, kinds 0, 1, 4).
  static void mutate(std::mt19937& rng, std::string& header, std::string& bytes, bool& raw) {
    auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
    static const char* kNumbers[] = {"0",
                                     "-1",
                                     "1.5",
                                     "1e308",
                                     "18446744073709551615",
                                     "18446744073709551616",
                                     "9223372036854775807",
                                     "4611686018427387904",
                                     "99999999999999999999999",
                                     "-0"};
    static const char* kDtypes[] = {"F64", "I8", "BOOL", "", "bf16", "F8_E5M2", "U8", "F32 "};
    static const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "-", "\\"};
    switch (pick(6)) {
      case 0: {  // a byte of the file (most of them in the header)
        raw = true;
        const size_t at = pick(4) == 0 ? pick(bytes.size()) : pick(8 + header.size());
        bytes[at] = static_cast<char>(pick(256));
        break;
      }
      case 1:  // truncated anywhere
        raw = true;
        bytes.resize(pick(bytes.size()));
        break;
      case 2:  // a digit run becomes an awkward number
        xds::testing::replace_a_digit_run(header, rng, kNumbers);
        break;
      case 3: {  // a dtype becomes another string
        const size_t at = header.find("\"dtype\":\"", pick(header.size()));
        if (at == std::string::npos) break;
        const size_t begin = at + 9, end = header.find('"', begin);
        if (end == std::string::npos) break;
        header.replace(begin, end - begin, kDtypes[pick(std::size(kDtypes))]);
        break;
      }
      case 4: {  // the header length field
        raw = true;
        const uint64_t n = header.size() + (8 - header.size() % 8) % 8;
        const uint64_t values[] = {0,
                                   1,
                                   n - 1,
                                   n + 8,
                                   bytes.size() - 8,
                                   bytes.size() - 7,
                                   uint64_t{1} << 63,
                                   ~uint64_t{0},
                                   100000000};
        const uint64_t v = values[pick(std::size(values))];
        for (int i = 0; i < 8 && i < static_cast<int>(bytes.size()); ++i)
          bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
        break;
      }
      default: {  // JSON punctuation dropped, or a token inserted
        const size_t at = pick(header.size());
        if (pick(2) == 0) {
          header.erase(at, 1);
        } else {
          header.insert(at, kTokens[pick(std::size(kTokens))]);
        }
        break;
      }
    }
  }

  // The tensors of an accepted file, checked against the file's bytes without the parser's
  // help: the data area is what follows the header length field's header; the tensors,
  // ordered by address, must tile it exactly from its start (the format's rule), each
  // holding shape product × dtype size bytes and the file's bytes at its place.
  static void expect_consistent(const SafetensorsFile& f, const std::string& bytes) {
    ASSERT_GE(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
    ASSERT_LE(n, bytes.size() - 8);
    const std::string_view data = std::string_view(bytes).substr(8 + n);
    std::vector<const TensorView*> by_address;
    for (const TensorView& t : f.tensors()) {
      uint64_t numel = 1;
      bool overflow = false;
      for (const int64_t d : t.shape) {
        ASSERT_GE(d, 0) << t.name;
        overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
      }
      uint64_t size = 0;
      overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &size);
      ASSERT_FALSE(overflow) << t.name << " " << t.shape_string();
      ASSERT_EQ(size, t.nbytes) << t.name << " " << t.shape_string();
      if (t.nbytes > 0) by_address.push_back(&t);
    }
    std::sort(by_address.begin(), by_address.end(),
              [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
    uint64_t offset = 0;  // where the next tensor must start
    for (const TensorView* t : by_address) {
      ASSERT_EQ(static_cast<uint64_t>(t->data - by_address.front()->data), offset) << t->name;
      ASSERT_LE(offset + t->nbytes, data.size()) << t->name << " runs past the file";
      ASSERT_EQ(std::string_view(reinterpret_cast<const char*>(t->data), t->nbytes),
                data.substr(offset, t->nbytes))
          << t->name;
      offset += t->nbytes;
    }
    ASSERT_EQ(offset, data.size()) << "the tensors leave bytes of the data area uncovered";
  }
};

TEST_F(SafetensorsMutations, EveryCaseIsAnErrorNamingTheFileOrConsistent) {
  ASSERT_TRUE(SafetensorsFile::open([&] {
                write("model.safetensors", safetensors_bytes(base_header(), base_data()));
                return path("model.safetensors");
              }())
                  .ok());
  int accepted = 0, refused = 0;
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    std::string header = base_header(), bytes;
    bool raw = false;
    const int count = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < count; ++m) {
      if (!raw) bytes = safetensors_bytes(header, base_data());
      mutate(rng, header, bytes, raw);
    }
    if (!raw) bytes = safetensors_bytes(header, base_data());
    write("model.safetensors", bytes);
    auto r = SafetensorsFile::open(path("model.safetensors"));
    if (r.ok()) {
      ++accepted;
      expect_consistent(*r, bytes);
    } else {
      ++refused;
      EXPECT_CONTAINS(r.status().message(), path("model.safetensors"));
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Both outcomes occur (a mutation of a space or of metadata leaves a valid file).
  EXPECT_GT(accepted, 10);
  EXPECT_GT(refused, 2000);
}

}  // namespace
}  // namespace xds
