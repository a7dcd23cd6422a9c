// The corpus replayer: a plain main() for a libFuzzer target, so that the kept corpus (seed
// inputs and every finding) runs as an ordinary test in the sanitizer builds without clang's
// libFuzzer. Each argument is a file or a directory (every regular file under it, in name
// order); each file is one call of LLVMFuzzerTestOneInput. A bug aborts (sanitizer report,
// XDS_CHECK, an escaping exception); otherwise it prints how many inputs ran.
//
//   fuzz_http_request tests/fuzz/corpus/http_request [more files or directories ...]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The files an argument names: itself, or the regular files under a directory, sorted.
std::vector<std::filesystem::path> inputs_of(const std::filesystem::path& arg) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(arg)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
  } else if (std::filesystem::is_regular_file(arg)) {
    out.push_back(arg);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  size_t runs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::vector<std::filesystem::path> files = inputs_of(argv[i]);
    if (files.empty()) {
      // A missing or empty corpus must not pass as "nothing failed".
      std::fprintf(stderr, "%s: no input files\n", argv[i]);
      return 1;
    }
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "%s: cannot read\n", path.c_str());
        return 1;
      }
      std::fprintf(stderr, "running %s (%zu bytes)\n", path.c_str(), bytes.size());
      // A copy of exactly `size` bytes on the heap, as libFuzzer passes it, so that ASan sees
      // a read one past the end.
      std::vector<uint8_t> data(bytes.begin(), bytes.end());
      LLVMFuzzerTestOneInput(data.data(), data.size());
      ++runs;
    }
  }
  std::fprintf(stderr, "%zu inputs ran\n", runs);
  return 0;
}
