#!/usr/bin/env bash
# Fuzzes the parsers of tests/fuzz with libFuzzer (clang, ASan + UBSan), one target after the
# other, each for a fixed time, and reports what crashed. Outside CI: CI only replays the kept
# corpus (the 'fuzz' CTest tests of tools/test.sh).
#
#   tools/fuzz.sh [-t SECONDS] [TARGET...]
#
#   -t SECONDS  time per target (default: $XDS_FUZZ_SECONDS, else 60)
#   TARGET      http_request, openai_request, safetensors_header, safetensors_index,
#               tokenizer_json, tokenizer_config, chat_template, wire_message, etcd_answer
#               (default: all)
#   XDS_FUZZ_ARGS  more libFuzzer flags, e.g. XDS_FUZZ_ARGS="-max_len=65536"
#
# Builds build/fuzz (CC=clang CXX=clang++, -DXDS_FUZZ=ON; only the fuzz targets), copies each
# target's corpus (tests/fuzz/corpus/<target>) to build/fuzz/work/<target>/corpus, and fuzzes
# that copy: the tree's corpus changes only when you copy a finding into it. Crashing, hanging
# (-timeout) and memory-hungry (-rss_limit_mb) inputs land in
# build/fuzz/work/<target>/artifacts/; the log is build/fuzz/work/<target>/fuzz.log. Exits 1
# when some target left an artifact. CONTRIBUTING.md ("Fuzzing") says what to do with one.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${XDS_FUZZ_SECONDS:-60}"
while getopts "t:h" opt; do
  case "$opt" in
    t) seconds="$OPTARG" ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

all_targets=(http_request openai_request safetensors_header safetensors_index tokenizer_json
             tokenizer_config chat_template wire_message etcd_answer)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  if [ ! -d "tests/fuzz/corpus/$t" ]; then
    echo "unknown target '$t' (one of: ${all_targets[*]})" >&2
    exit 2
  fi
done

build=build/fuzz
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache
                                          -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DXDS_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
cmake --build "$build" --target "${targets[@]/#/fuzz_}"

found=0
summary=()
for t in "${targets[@]}"; do
  work="$build/work/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -r "tests/fuzz/corpus/$t/." "$work/corpus/"
  dict=()
  [ -f "tests/fuzz/dict/$t.dict" ] && dict=("-dict=tests/fuzz/dict/$t.dict")
  echo "== fuzz_$t: ${seconds} s (log: $work/fuzz.log)"
  # -timeout: one input running longer is a hang; -rss_limit_mb: more memory is a finding.
  # shellcheck disable=SC2086
  "$build/tests/fuzz/fuzz_$t" "$work/corpus" "${dict[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" ${XDS_FUZZ_ARGS:-} >"$work/fuzz.log" 2>&1 || true
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$' || true)
  artifacts=$(find "$work/artifacts" -type f | sort)
  summary+=("$(printf '%-20s %6s s %12s runs %5s corpus files  %s' "$t" "$seconds" "${runs:-?}" \
    "$(find "$work/corpus" -type f | wc -l)" "${artifacts:+FOUND: $(echo "$artifacts" | wc -l) artifact(s)}")")
  if [ -n "$artifacts" ]; then
    found=1
    echo "$artifacts" | sed 's/^/   /'
    grep -m 3 -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|.*check failed|.*terminate called)' \
      "$work/fuzz.log" | sed 's/^/   /' || true
  fi
done

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$found"
