// The KV transfer of prefill/decode disaggregation (P104), one round: a decode side pulls KV
// blocks that a prefill side lends, through each backend in turn:
//   memcpy  plain std::memcpy from a region of this process (the physical limit of shm)
//   shm     XCCL shared-memory link: get from the peer's exported SharedRegion
//   ucx     XCCL UCX link over TCP loopback (UCX_TLS=tcp): ucp_get_nbx from the peer's
//           exported region, then flush
//   ucx_seg64k  the same with UCX's TCP segments at 64 KB instead of 8 KB (UcxLinkOptions::
//           ucx_config {TX_SEG_SIZE, RX_SEG_SIZE})
// Cases (bench-2.6b: a block is 16 tokens x 13 layers x (512 + 64) x 2 bytes = 239,616 bytes;
// a request of 4096 tokens is 256 blocks):
//   block           one block per transfer (get + flush): per-block latency
//   request         one contiguous 256-block message per transfer
//   request_blocks  256 one-block gets, then one flush (how DistFlow pulls a request)
// After one pass over the region (page tables warm), each transfer reads a different place of
// a 128 MB region (cold in cache); the last one is
// checked byte for byte against the region's pattern. The exporter is a forked child that
// stays until the puller has gone. Output: one JSON line per (backend, case) with the median
// transfer time. bench/xccl/kv_transfer.sh runs rounds, ucx_perftest beside, and the report.
//   kv_transfer_bench OUT.jsonl ROUND [--quick]
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "xccl/link.h"
#include "xccl/shared_region.h"
#include "xccl/transport.h"
#include "xccl/ucx_link.h"

namespace {

using namespace xds::xccl;

constexpr uint64_t kBlockBytes = 16ull * 13 * (512 + 64) * 2;  // 239,616
constexpr uint64_t kRequestBlocks = 256;                       // 4096 tokens
constexpr uint64_t kRegionBytes = 128ull << 20;

struct Case {
  const char* name;
  uint64_t bytes;  // per get
  uint64_t gets;   // per transfer (then one flush)
  int transfers;
};

std::vector<Case> cases(bool quick) {
  return {{"block", kBlockBytes, 1, quick ? 50 : 200},
          {"request", kBlockBytes * kRequestBlocks, 1, quick ? 2 : 5},
          {"request_blocks", kBlockBytes, kRequestBlocks, quick ? 2 : 5}};
}

uint8_t pattern_byte(uint64_t i) {
  return static_cast<uint8_t>(i * 131 + (i >> 12));
}
void fill_pattern(std::byte* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) p[i] = std::byte{pattern_byte(i)};
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Where get g of transfer t reads: walks the region in 4 KB-aligned steps.
uint64_t source_offset(int t, uint64_t g, const Case& c) {
  const uint64_t step = (c.bytes + 4095) / 4096 * 4096;
  const uint64_t slots = (kRegionBytes - c.bytes) / step;
  return ((static_cast<uint64_t>(t) * c.gets + g) % slots) * step;
}

// Runs `get(dst, src_offset, bytes)` gets then `flush()`, per transfer; returns the median
// transfer time, or < 0 when an operation failed or the last transfer's bytes are wrong.
double measure(const Case& c, std::vector<std::byte>& dst,
               const std::function<bool(std::byte*, uint64_t, uint64_t)>& get,
               const std::function<bool()>& flush) {
  // Steady state: one pass over the whole region first. A fresh mapping of the peer's region
  // (shm) costs a page fault per 4 KB on first touch (docs/benchmarks.md), once per link.
  for (uint64_t off = 0; off < kRegionBytes; off += 1 << 20) {
    if (!get(dst.data(), off, 1 << 20)) return -1;
  }
  if (!flush()) return -1;
  std::vector<double> times;
  for (int t = -1; t < c.transfers; ++t) {  // t = -1: warm-up
    const double t0 = now_s();
    for (uint64_t g = 0; g < c.gets; ++g) {
      if (!get(dst.data() + g * c.bytes, source_offset(std::max(t, 0), g, c), c.bytes)) return -1;
    }
    if (!flush()) return -1;
    if (t >= 0) times.push_back(now_s() - t0);
  }
  const int last = c.transfers - 1;
  for (uint64_t g = 0; g < c.gets; ++g) {
    const uint64_t off = source_offset(last, g, c);
    for (uint64_t i = 0; i < c.bytes; i += 997) {
      if (dst[g * c.bytes + i] != std::byte{pattern_byte(off + i)}) {
        std::fprintf(stderr, "kv_transfer_bench: %s: byte %llu of get %llu is wrong\n", c.name,
                     static_cast<unsigned long long>(i), static_cast<unsigned long long>(g));
        return -1;
      }
    }
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void report(FILE* out, int round, const char* backend, const Case& c, double median_s) {
  const double bytes = static_cast<double>(c.bytes * c.gets);
  std::fprintf(out,
               "{\"bench\":\"kv_transfer\",\"round\":%d,\"backend\":\"%s\",\"case\":\"%s\","
               "\"bytes_per_get\":%llu,\"gets\":%llu,\"transfers\":%d,\"median_s\":%.9f,"
               "\"gbps\":%.4f,\"latency_us\":%.2f,\"ok\":%s}\n",
               round, backend, c.name, static_cast<unsigned long long>(c.bytes),
               static_cast<unsigned long long>(c.gets), c.transfers, median_s,
               median_s > 0 ? bytes / median_s / 1e9 : 0.0, median_s * 1e6,
               median_s > 0 ? "true" : "false");
  std::printf("round %d  %-7s %-15s %8.3f GB/s  %10.1f us per transfer\n", round, backend, c.name,
              median_s > 0 ? bytes / median_s / 1e9 : 0.0, median_s * 1e6);
  std::fflush(stdout);
}

// The exporter and the puller: the child (exporter) stays until the parent closes its end of
// `done` (or 10 minutes passed); a pidfd would not do, the puller goes on living.
struct DonePipe {
  int fd[2] = {-1, -1};
  DonePipe() {
    if (pipe(fd) != 0) fd[0] = fd[1] = -1;
  }
  void child_waits() {  // in the child: its copy of the write end must go first
    close(fd[1]);
    pollfd p{fd[0], POLLIN, 0};
    poll(&p, 1, 600'000);
  }
  void parent_done() {
    close(fd[1]);
    close(fd[0]);
  }
};

int wait_child(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

ArenaConfig small_arena() {
  ArenaConfig c;
  c.lanes = 1;
  c.app_bytes = 1 << 16;
  return c;
}

bool run_memcpy(FILE* out, int round, const std::vector<Case>& cs, std::vector<std::byte>& dst) {
  std::vector<std::byte> region(kRegionBytes);
  fill_pattern(region.data(), kRegionBytes);
  for (const Case& c : cs) {
    const double m = measure(
        c, dst,
        [&](std::byte* d, uint64_t off, uint64_t n) {
          std::memcpy(d, region.data() + off, n);
          return true;
        },
        [] { return true; });
    report(out, round, "memcpy", c, m);
    if (m < 0) return false;
  }
  return true;
}

bool run_shm(FILE* out, int round, const std::vector<Case>& cs, std::vector<std::byte>& dst) {
  const std::string name = "kv-bench-" + std::to_string(getpid());
  auto listener = LinkListener::listen(name);
  if (!listener.ok()) return false;
  DonePipe done;
  const pid_t child = fork();
  if (child == 0) {
    auto region = SharedRegion::create("kv-bench", kRegionBytes);
    if (!region.ok()) _exit(2);
    fill_pattern(region->data(), kRegionBytes);
    auto f = listener->accept(small_arena(), 1, 60'000, &*region);
    if (!f.ok()) _exit(3);
    done.child_waits();
    _exit(0);
  }
  bool ok = true;
  {
    auto f = link_connect(name, small_arena(), 1, 60'000);
    if (!f.ok()) {
      std::fprintf(stderr, "shm link: %s\n", f.status().to_string().c_str());
      ok = false;
    }
    auto t = ok ? make_transport("shm", **f)
                : xds::Result<std::unique_ptr<Transport>>(xds::unavailable("no link"));
    for (size_t i = 0; ok && i < cs.size(); ++i) {
      const MemDesc src{0, 0, kRegionBytes, kExportRegion};
      const double m = measure(
          cs[i], dst,
          [&](std::byte* d, uint64_t off, uint64_t n) {
            return (*t)->get(d, src, off, n) != OpState::kFailed;
          },
          [&] { return (*t)->flush() == OpState::kDone; });
      report(out, round, "shm", cs[i], m);
      ok = m >= 0;
    }
  }
  done.parent_done();
  return wait_child(child) == 0 && ok;
}

// `backend` "ucx": UCX's default settings; "ucx_seg64k": TCP segments of 64 KB (default 8 KB).
bool run_ucx(FILE* out, int round, const std::vector<Case>& cs, std::vector<std::byte>& dst,
             const char* backend) {
  auto listener = UcxListener::listen("127.0.0.1", 0);
  if (!listener.ok()) return false;
  DonePipe done;
  UcxLinkOptions o;
  o.config = small_arena();
  o.epoch = 1;
  o.tls = "tcp";
  o.timeout_ms = 60'000;
  o.flush_timeout_ms = 120'000;
  o.secret = LinkSecret{};  // one fixed secret on both sides: the handshake runs as in DistFlow
  o.secret->fill(0x6b);
  if (std::strcmp(backend, "ucx_seg64k") == 0) {
    o.ucx_config = {{"TX_SEG_SIZE", "64k"}, {"RX_SEG_SIZE", "64k"}};
  }
  const pid_t child = fork();  // before this process initialises UCX
  if (child == 0) {
    std::vector<std::byte> region(kRegionBytes);
    fill_pattern(region.data(), kRegionBytes);
    UcxLinkOptions mine = o;
    mine.exported = region;
    auto l = listener->accept(mine);
    if (!l.ok()) _exit(3);
    done.child_waits();
    _exit(0);
  }
  bool ok = true;
  {
    auto l = ucx_connect("127.0.0.1", listener->port(), o);
    if (!l.ok()) {
      std::fprintf(stderr, "ucx link: %s\n", l.status().to_string().c_str());
      ok = false;
    }
    for (size_t i = 0; ok && i < cs.size(); ++i) {
      Transport& t = (*l)->transport();
      const MemDesc src{0, 0, kRegionBytes, kExportRegion};
      const double m = measure(
          cs[i], dst,
          [&](std::byte* d, uint64_t off, uint64_t n) {
            return t.get(d, src, off, n) != OpState::kFailed;
          },
          [&] { return t.flush() == OpState::kDone; });
      report(out, round, backend, cs[i], m);
      ok = m >= 0;
    }
  }
  done.parent_done();
  return wait_child(child) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kv_transfer_bench OUT.jsonl ROUND [--quick]\n");
    return 2;
  }
  const int round = std::atoi(argv[2]);
  const bool quick = argc > 3 && std::strcmp(argv[3], "--quick") == 0;
  FILE* out = std::fopen(argv[1], "a");
  if (out == nullptr) {
    std::fprintf(stderr, "kv_transfer_bench: cannot open %s\n", argv[1]);
    return 2;
  }
  const std::vector<Case> cs = cases(quick);
  std::vector<std::byte> dst(kBlockBytes * kRequestBlocks);
  // shm and memcpy first: the UCX round forks its exporter before this process loads UCX.
  const bool ok = run_memcpy(out, round, cs, dst) && run_shm(out, round, cs, dst) &&
                  run_ucx(out, round, cs, dst, "ucx") && run_ucx(out, round, cs, dst, "ucx_seg64k");
  std::fclose(out);
  return ok ? 0 : 1;
}
