// Where a benchmark's results go. By default a run writes bench-out/<name>.json and
// bench-out/<name>.txt at the top of the source tree (bench-out/ is not tracked); --json FILE
// puts the JSON at FILE and the table beside it (FILE with its extension replaced by .txt);
// --save also copies the run into bench/results/<name>.json and .txt, the tracked latest run
// of each benchmark.
//
// The .txt is what the program printed on stdout while the capture ran (its table), not
// stderr (progress). Usage, in main, after parsing the flags:
//
//   bench::RunOutput out;                 // from here on stdout is also captured
//   ... print the table, build json ...
//   return out.finish(opts, "bench_linear", j) ? 0 : 1;
#pragma once

#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace CLI {
class App;
}

namespace xds::bench {

struct OutputOptions {
  std::string json_path;  // --json FILE; empty: bench-out/<name>.json
  bool save = false;      // --save: also copy the run into bench/results/
};

// Adds --json FILE and --save to app, writing into opts (which must outlive the parse).
void add_output_flags(CLI::App& app, OutputOptions& opts);

// Parses --json FILE / --save at argv[i] for programs without CLI11. Returns how many
// arguments it consumed (0: not an output flag; -1: --json without its FILE).
int parse_output_flag(int argc, char** argv, int i, OutputOptions& opts);

// The top of the source tree, bench-out/ and bench/results/ under it (compile-time paths).
std::string source_dir();
std::string default_out_dir();
std::string results_dir();

// The .txt path of a JSON path: its extension replaced by .txt (".txt" appended if none).
std::string text_path_for(const std::string& json_path);

// Captures stdout (file descriptor 1) from construction until finish() or destruction while
// still passing it through to where stdout went before: a pipe read by a thread of its own.
// One per process, created and finished on the main thread; not thread-safe otherwise. If the
// pipe cannot be set up, the run goes on uncaptured and the .txt says so.
class RunOutput {
 public:
  RunOutput();
  ~RunOutput();
  RunOutput(const RunOutput&) = delete;
  RunOutput& operator=(const RunOutput&) = delete;

  // Stops the capture and writes the JSON and the captured text where opts says (see the
  // top of this file), printing "wrote <path>" for each file. Returns false, after an error
  // message naming the path, if a file could not be written.
  bool finish(const OutputOptions& opts, const std::string& name, const nlohmann::json& j);

  // Stops the capture (idempotent) and returns the text captured so far.
  const std::string& stop();

 private:
  int saved_stdout_ = -1;  // a duplicate of the original stdout; -1 when not capturing
  int read_end_ = -1;      // the pipe's read end, owned by reader_
  std::thread reader_;     // copies the pipe to saved_stdout_ and into text_
  std::string text_;       // written by reader_ until it is joined
  bool capturing_ = false;
};

}  // namespace xds::bench
