#include "run_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "base/atomic_file.h"
#include "json_out.h"

namespace xds::bench {

namespace {

// Writes all of text to path (whole or not at all); prints "wrote <path>" or an error.
bool write_text(const std::string& path, const std::string& text) {
  Result<AtomicFile> file = AtomicFile::create(path);
  Status st = file.ok() ? file->write(text) : file.status();
  if (st.ok()) st = file->commit();
  if (!st.ok()) {
    std::fprintf(stderr, "error: could not write %s: %s\n", path.c_str(), st.to_string().c_str());
    return false;
  }
  std::printf("wrote %s\n", path.c_str());
  return true;
}

// Creates the directory that will hold path; false (with an error naming it) if it cannot.
bool make_parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return true;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) {
    std::fprintf(stderr, "error: could not create directory %s: %s\n", parent.c_str(),
                 ec.message().c_str());
    return false;
  }
  return true;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the original stdout is gone: keep capturing, stop passing through
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

void add_output_flags(CLI::App& app, OutputOptions& opts) {
  app.add_option("--json", opts.json_path,
                 "write the JSON here (and the printed table beside it as .txt) instead of "
                 "bench-out/<name>.json");
  app.add_flag("--save", opts.save,
               "also copy the run (JSON and table) into bench/results/, the tracked latest run");
}

int parse_output_flag(int argc, char** argv, int i, OutputOptions& opts) {
  if (std::strcmp(argv[i], "--save") == 0) {
    opts.save = true;
    return 1;
  }
  if (std::strcmp(argv[i], "--json") == 0) {
    if (i + 1 >= argc) return -1;
    opts.json_path = argv[i + 1];
    return 2;
  }
  return 0;
}

std::string source_dir() { return XDS_BENCH_SOURCE_DIR; }
std::string default_out_dir() { return source_dir() + "/bench-out"; }
std::string results_dir() { return source_dir() + "/bench/results"; }

std::string text_path_for(const std::string& json_path) {
  std::filesystem::path p(json_path);
  if (!p.has_filename()) return json_path + ".txt";
  return p.replace_extension(".txt").string();
}

RunOutput::RunOutput() {
  std::fflush(stdout);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return;
  saved_stdout_ = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (saved_stdout_ < 0 || ::dup2(p[1], STDOUT_FILENO) < 0) {
    if (saved_stdout_ >= 0) ::close(saved_stdout_);
    saved_stdout_ = -1;
    ::close(p[0]);
    ::close(p[1]);
    return;
  }
  ::close(p[1]);  // fd 1 is now the pipe's only write end: restoring fd 1 ends the reader
  read_end_ = p[0];
  // A pipe would make stdout fully buffered; keep the table appearing line by line.
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  capturing_ = true;
  reader_ = std::thread([this] {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(read_end_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      write_all(saved_stdout_, buf, static_cast<size_t>(n));
      text_.append(buf, static_cast<size_t>(n));
    }
    ::close(read_end_);
  });
}

RunOutput::~RunOutput() { stop(); }

const std::string& RunOutput::stop() {
  if (!capturing_) return text_;
  std::fflush(stdout);
  ::dup2(saved_stdout_, STDOUT_FILENO);  // closes the pipe's write end: the reader sees EOF
  reader_.join();
  ::close(saved_stdout_);
  saved_stdout_ = -1;
  read_end_ = -1;
  capturing_ = false;
  return text_;
}

bool RunOutput::finish(const OutputOptions& opts, const std::string& name,
                       const nlohmann::json& j) {
  const bool captured = capturing_;
  std::string text = stop();
  if (!captured) text = "(the printed table could not be captured)\n" + text;
  const std::string json_path =
      opts.json_path.empty() ? default_out_dir() + "/" + name + ".json" : opts.json_path;
  bool ok = make_parent_dir(json_path) && write_json(json_path, j) &&
            write_text(text_path_for(json_path), text);
  if (ok && opts.save) {
    const std::string saved = results_dir() + "/" + name + ".json";
    ok = make_parent_dir(saved) && write_json(saved, j) &&
         write_text(text_path_for(saved), text);
  }
  return ok;
}

}  // namespace xds::bench
