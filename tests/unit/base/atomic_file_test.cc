#include "base/atomic_file.h"
#include "base/read_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace xds {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("xds_atomic_file_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Names in the directory (the temporaries included).
  std::vector<std::string> entries() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path dir_;
};

TEST_F(AtomicFileTest, CommitPutsTheWholeFileInPlace) {
  const std::string path = (dir_ / "out.bin").string();
  auto f = AtomicFile::create(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  // More than one flush's worth, in pieces of odd sizes, bytes 0-255 repeating.
  std::string expect;
  for (size_t i = 0; i < AtomicFile::kFlushBytes * 2 + 12345; ++i)
    expect.push_back(static_cast<char>(i % 251));
  for (size_t at = 0; at < expect.size(); at += 70001) {
    const size_t n = std::min<size_t>(70001, expect.size() - at);
    ASSERT_TRUE(f->write(expect.data() + at, n).ok());
    EXPECT_FALSE(fs::exists(path)) << "visible before commit";
  }
  ASSERT_TRUE(f->commit().ok());
  EXPECT_EQ(read(path), expect);
  EXPECT_EQ(entries(), std::vector<std::string>{"out.bin"});  // no temporary left
  EXPECT_FALSE(f->write("x").ok());                           // spent
}

TEST_F(AtomicFileTest, WithoutCommitNothingChangesAtThePath) {
  const fs::path path = dir_ / "logits.bin";
  std::ofstream(path) << "the previous run's whole file";
  {
    auto f = AtomicFile::create(path.string());
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->write(std::string(3 * AtomicFile::kFlushBytes, 'n')).ok());  // flushed
  }  // an error return path: destroyed uncommitted
  EXPECT_EQ(read(path), "the previous run's whole file");
  EXPECT_EQ(entries(), std::vector<std::string>{"logits.bin"});
  {
    auto f = AtomicFile::create((dir_ / "new.bin").string());
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->write("partial").ok());
  }
  EXPECT_FALSE(fs::exists(dir_ / "new.bin"));
  EXPECT_EQ(entries(), std::vector<std::string>{"logits.bin"});
}

TEST_F(AtomicFileTest, MovedFromLeavesOneOwner) {
  const std::string path = (dir_ / "m.txt").string();
  auto f = AtomicFile::create(path);
  ASSERT_TRUE(f.ok());
  AtomicFile g = std::move(*f);
  ASSERT_TRUE(g.write("moved").ok());
  ASSERT_TRUE(g.commit().ok());
  EXPECT_EQ(read(path), "moved");
  EXPECT_EQ(entries(), std::vector<std::string>{"m.txt"});
}

TEST_F(AtomicFileTest, ErrorsNameThePath) {
  const std::string in_missing_dir = (dir_ / "no" / "such" / "out.bin").string();
  auto f = AtomicFile::create(in_missing_dir);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(in_missing_dir), std::string::npos) << f.status().message();
  // A directory at the destination is refused at once; one that appears there before the
  // commit makes the rename fail, and the temporary goes.
  fs::create_directories(dir_ / "taken");
  auto d = AtomicFile::create((dir_ / "taken").string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find((dir_ / "taken").string() + ": is a directory"),
            std::string::npos)
      << d.status().message();
  auto g = AtomicFile::create((dir_ / "later").string());
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(g->write("x").ok());
  fs::create_directories(dir_ / "later");
  const Status s = g->commit();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find((dir_ / "later").string()), std::string::npos) << s.message();
  EXPECT_EQ(entries(), (std::vector<std::string>{"later", "taken"}));
}

TEST_F(AtomicFileTest, ReadWholeFileReturnsTheBytesOrNamesThePath) {
  const std::string bytes("a\0b\xff\n", 5);  // NUL and a non-UTF-8 byte survive
  {
    auto f = AtomicFile::create((dir_ / "in.bin").string());
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->write(bytes).ok());
    ASSERT_TRUE(f->commit().ok());
  }
  auto r = read_whole_file((dir_ / "in.bin").string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, bytes);

  r = read_whole_file(dir_.string());  // a directory opens as a stream and reads as empty
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(dir_.string() + ": is a directory"), std::string::npos)
      << r.status().message();

  const std::string missing = (dir_ / "missing.json").string();
  r = read_whole_file(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace xds
