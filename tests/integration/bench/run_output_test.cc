// bench::RunOutput and its paths: the table printed on stdout lands in the .txt beside the
// JSON and still reaches the original stdout; expected contents are the literal strings the
// test prints, paths are derived by hand.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "run_output.h"

namespace xds::bench {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string temp_dir() {
  char tmpl[] = "/tmp/run_output_test.XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "";
}

TEST(RunOutput, TextPathReplacesTheExtension) {
  EXPECT_EQ(text_path_for("out/run.json"), "out/run.txt");
  EXPECT_EQ(text_path_for("run.json"), "run.txt");
  EXPECT_EQ(text_path_for("a.b/run"), "a.b/run.txt");
  EXPECT_EQ(text_path_for("run.v2.json"), "run.v2.txt");
}

TEST(RunOutput, DefaultAndSavedPlacesAreInTheSourceTree) {
  EXPECT_EQ(default_out_dir(), source_dir() + "/bench-out");
  EXPECT_EQ(results_dir(), source_dir() + "/bench/results");
  EXPECT_TRUE(std::filesystem::is_directory(results_dir())) << results_dir();
}

TEST(RunOutput, ParsesItsFlagsWithoutCli11) {
  const char* args[] = {"bench", "--json", "x.json", "--save", "--mb", "--json"};
  char** argv = const_cast<char**>(args);
  OutputOptions o;
  EXPECT_EQ(parse_output_flag(6, argv, 1, o), 2);
  EXPECT_EQ(o.json_path, "x.json");
  EXPECT_EQ(parse_output_flag(6, argv, 3, o), 1);
  EXPECT_TRUE(o.save);
  EXPECT_EQ(parse_output_flag(6, argv, 4, o), 0);   // not an output flag
  EXPECT_EQ(parse_output_flag(6, argv, 5, o), -1);  // --json without its FILE
}

TEST(RunOutput, TheTableGoesToTheTextFileAndStillToStdout) {
  const std::string dir = temp_dir();
  // Stand-in for the terminal: stdout goes to a file while the capture runs on top of it.
  const std::string terminal = dir + "/terminal";
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  const int term_fd = ::open(terminal.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(term_fd, 0);
  ASSERT_GE(::dup2(term_fd, STDOUT_FILENO), 0);
  ::close(term_fd);
  bool ok = false;
  {
    RunOutput out;
    std::printf("row 1 | 2.50\n");
    std::fprintf(stderr, "progress (not in the table)\n");
    std::printf("row 2 | %d\n", 7);
    OutputOptions opts;
    opts.json_path = dir + "/sub/run.json";  // the directory is created
    ok = out.finish(opts, "ignored_name", nlohmann::json{{"rows", 2}});
    std::printf("after the capture\n");
  }
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ASSERT_TRUE(ok);
  EXPECT_EQ(read_all(dir + "/sub/run.txt"), "row 1 | 2.50\nrow 2 | 7\n");
  EXPECT_EQ(nlohmann::json::parse(read_all(dir + "/sub/run.json")), (nlohmann::json{{"rows", 2}}));
  EXPECT_EQ(read_all(terminal),
            "row 1 | 2.50\nrow 2 | 7\nwrote " + dir + "/sub/run.json\nwrote " + dir +
                "/sub/run.txt\nafter the capture\n");
  std::filesystem::remove_all(dir);
}

TEST(RunOutput, AnUnwritablePlaceIsAnErrorNotACrash) {
  const std::string dir = temp_dir();
  const std::string file = dir + "/file";
  std::ofstream(file) << "x";
  RunOutput out;
  OutputOptions opts;
  opts.json_path = file + "/run.json";  // a path under a regular file
  EXPECT_FALSE(out.finish(opts, "x", nlohmann::json::object()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xds::bench
