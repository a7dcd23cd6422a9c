// XCCL benchmarks (run.sh runs this beside Open MPI and prints the table):
//   memcpy  single-thread memcpy of cold (DRAM) buffers: the physical limit of one copy
//   p2p     send/recv ping-pong, 8 B .. 64 MB x lanes {1, 2, 4}; zero-copy put+signal (paper Fig.
//   5) moe     dispatch / combine, tokens per device 1..512, hidden 2048 / 7168, top-8 of 256
//           experts, bf16 and INT8 (paper Fig. 6)
// Two device processes pinned to cores 0 and 1. Writes JSON lines to OUT.
//   xccl_bench OUT.jsonl [--quick] [memcpy|p2p|moe|lat ROUND]
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "bench_common.h"
#include "xccl/launcher.h"
#include "xccl/moe.h"
#include "xccl/p2p.h"
#include "xccl/rowops.h"

namespace {

using namespace xbench;
using namespace xds;
using namespace xds::xccl;

void bench_memcpy(const char* out, bool quick) {
  for (size_t n : p2p_sizes(quick)) {
    ColdPool src(n), dst(n, size_t(64) << 20);
    // 16 batches; the median batch mean resists the other tenants of a shared machine.
    const int per_batch = std::max(1, iterations_for(n, quick) / 16);
    std::vector<double> samples;
    for (int b = 0; b < 17; ++b) {
      const double t0 = now_s();
      for (int i = 0; i < per_batch; ++i) std::memcpy(dst.get(), src.get(), n);
      if (b > 0) samples.push_back((now_s() - t0) / per_batch);
    }
    const double med = median(samples);
    jsonl(out, "{\"bench\":\"memcpy\",\"impl\":\"memcpy\",\"bytes\":" + std::to_string(n) +
                   ",\"us\":" + std::to_string(med * 1e6) +
                   ",\"min_us\":" + std::to_string(min_of(samples) * 1e6) +
                   ",\"gbps\":" + std::to_string(double(n) / med / 1e9) + "}");
  }
}

// Interleaved latency rounds (run.sh alternates this with the Open MPI one, so both sides
// meet the same machine state): 8 B send/recv ping-pong only, 20000 round trips, one JSON line.
int g_lat_round = 0;

Status lat_device(Fabric& f, const char* out, bool) {
  XDS_ASSIGN_OR_RETURN(auto t, make_transport("shm", f));
  const int me = f.rank(), peer = 1 - me;
  P2p p2p(f, *t, P2pOptions{.timeout_ms = 600'000});
  std::byte sbuf[8] = {}, rbuf[8];
  std::vector<double> samples;
  for (int i = 0; i < 20'002; ++i) {
    const double t0 = now_s();
    if (me == 0) {
      XDS_RETURN_IF_ERROR(p2p.send(peer, uint64_t(i), sbuf));
      XDS_RETURN_IF_ERROR(p2p.recv(peer, uint64_t(i), rbuf).status());
    } else {
      XDS_RETURN_IF_ERROR(p2p.recv(peer, uint64_t(i), rbuf).status());
      XDS_RETURN_IF_ERROR(p2p.send(peer, uint64_t(i), sbuf));
    }
    if (i >= 2) samples.push_back((now_s() - t0) / 2);
  }
  if (me == 0)
    jsonl(out, "{\"bench\":\"lat\",\"impl\":\"xccl\",\"bytes\":8,\"round\":" +
                   std::to_string(g_lat_round) +
                   ",\"one_way_us\":" + std::to_string(median(samples) * 1e6) +
                   ",\"one_way_min_us\":" + std::to_string(min_of(samples) * 1e6) + "}");
  return Status::ok_status();
}

Status p2p_device(Fabric& f, const char* out, bool quick) {
  XDS_ASSIGN_OR_RETURN(auto t, make_transport("shm", f));
  const int me = f.rank(), peer = 1 - me;
  for (int lanes : {1, 2, 4}) {
    ThreadPool pool(lanes, ThreadPool::kNoSpin);  // idle lanes must not steal the peer's core
    P2p p2p(f, *t, P2pOptions{.lanes = lanes, .pool = &pool, .timeout_ms = 600'000});
    for (size_t n : p2p_sizes(quick)) {
      if (lanes > 1 && n < 4096) continue;  // a small message uses one lane anyway
      ColdPool sp(n), rp(n);
      const int iters = iterations_for(n, quick) + 2;
      std::vector<double> samples;  // one-way = round trip / 2; the first two warm up
      for (int i = 0; i < iters; ++i) {
        auto src = std::span<const std::byte>(reinterpret_cast<std::byte*>(sp.get()), n);
        auto dst = std::span<std::byte>(reinterpret_cast<std::byte*>(rp.get()), n);
        const double t0 = now_s();
        if (me == 0) {
          XDS_RETURN_IF_ERROR(p2p.send(peer, uint64_t(i), src));
          XDS_RETURN_IF_ERROR(p2p.recv(peer, uint64_t(i), dst).status());
        } else {
          XDS_RETURN_IF_ERROR(p2p.recv(peer, uint64_t(i), dst).status());
          XDS_RETURN_IF_ERROR(p2p.send(peer, uint64_t(i), src));
        }
        if (i >= 2) samples.push_back((now_s() - t0) / 2);
      }
      const double best = median(samples);
      if (me == 0)
        jsonl(out, "{\"bench\":\"p2p\",\"impl\":\"xccl\",\"bytes\":" + std::to_string(n) +
                       ",\"lanes\":" + std::to_string(lanes) +
                       ",\"one_way_us\":" + std::to_string(best * 1e6) +
                       ",\"one_way_min_us\":" + std::to_string(min_of(samples) * 1e6) +
                       ",\"gbps\":" + std::to_string(double(n) / best / 1e9) + "}");
    }
  }
  // Zero-copy: put into the peer's registered (application) buffer + signal; one copy.
  P2p p2p(f, *t, P2pOptions{.timeout_ms = 600'000});
  uint64_t v = 0;
  for (size_t n : p2p_sizes(quick)) {
    ColdPool sp(n);
    const int iters = iterations_for(n, quick) + 2;
    std::vector<double> samples;
    for (int i = 0; i < iters; ++i) {
      ++v;
      auto src = std::span<const std::byte>(reinterpret_cast<std::byte*>(sp.get()), n);
      const double t0 = now_s();
      if (me == 0) {
        XDS_RETURN_IF_ERROR(p2p.put(p2p.app_desc(peer), 0, src, 0, v));
        XDS_RETURN_IF_ERROR(p2p.wait_signal(peer, 0, v));
      } else {
        XDS_RETURN_IF_ERROR(p2p.wait_signal(peer, 0, v));
        XDS_RETURN_IF_ERROR(p2p.put(p2p.app_desc(peer), 0, src, 0, v));
      }
      if (i >= 2) samples.push_back((now_s() - t0) / 2);
    }
    const double best = median(samples);
    if (me == 0)
      jsonl(out, "{\"bench\":\"p2p_put\",\"impl\":\"xccl\",\"bytes\":" + std::to_string(n) +
                     ",\"lanes\":1,\"one_way_us\":" + std::to_string(best * 1e6) +
                     ",\"one_way_min_us\":" + std::to_string(min_of(samples) * 1e6) +
                     ",\"gbps\":" + std::to_string(double(n) / best / 1e9) + "}");
  }
  return Status::ok_status();
}

MoeConfig moe_cfg(int hidden, bool int8) {
  return MoeConfig{.hidden = hidden,
                   .topk = 8,
                   .max_tokens = 512,
                   .slots_per_device = 128,
                   .int8 = int8,
                   .timeout_ms = 600'000};
}

Status moe_device(Fabric& f, const char* out, bool quick) {
  XDS_ASSIGN_OR_RETURN(auto t, make_transport("shm", f));
  Mailbox mb(f, *t);
  const int me = f.rank();
  const std::vector<int> peers = {1 - me};
  const ExpertMap map = ExpertMap::identity(256, 2, 128);
  uint64_t key = 0;
  for (int H : {2048, 7168}) {
    // dtype: bf16; int8 = dispatch quantizes the rows remote receivers need (critical path);
    // int8 + producer = the engine's producer epilogue wrote every token's INT8 row beside
    // the bf16 one (SenderRows::kBf16AndInt8; not timed, like the bf16 input write), dispatch
    // only dequantizes.
    for (int variant : {0, 1, 2}) {
      const bool int8 = variant > 0, producer = variant == 2;
      const SenderRows form = producer ? SenderRows::kBf16AndInt8 : SenderRows::kBf16;
      ExchangeRoles roles{{0, 1}, {0, 1}, f.layout().staging};
      XDS_ASSIGN_OR_RETURN(auto ex, Exchange::create(mb, moe_cfg(H, int8), roles, nullptr));
      for (int T : moe_token_counts()) {
        std::vector<int32_t> ids;
        std::vector<float> w;
        make_routing(me, T, 8, 256, ids, w);
        const size_t TH = static_cast<size_t>(T) * static_cast<size_t>(H);
        std::vector<uint16_t> x(TH), y(TH);
        for (size_t i = 0; i < x.size(); ++i)
          x[i] = float_to_bf16(float(int(mix(i) % 200) - 100) / 50.f);
        // presum "combine": combine pre-sums from one expert output per (token, expert);
        // presum "experts": the experts' epilogue pre-summed (not timed), combine moves one
        // vector per (token, device) and sums.
        for (const char* presum : {"combine", "experts"}) {
          const bool in_combine = presum[0] == 'c';
          std::vector<double> td, tc, tin;
          uint64_t bytes = 0;
          const int iters = quick ? 10 : 40;
          for (int it = 0; it < iters + 3; ++it) {
            ++key;
            XDS_RETURN_IF_ERROR(
                barrier(mb, peers, key, WaitCtx{OpKind::kBarrier, deadline_after_ms(600'000)}));
            const double ti = now_s();
            XDS_ASSIGN_OR_RETURN(uint16_t * in, ex->input_rows());
            std::memcpy(in, x.data(), x.size() * 2);
            if (producer) {  // the epilogue's second store of each row, INT8 + scale
              XDS_ASSIGN_OR_RETURN(std::byte * q, ex->int8_rows());
              for (int i = 0; i < T; ++i)
                quantize_row_int8(x.data() + size_t(i) * size_t(H), H,
                                  q + size_t(i) * int8_row_stride(H));
            }
            const uint64_t b0 = ex->stats().bytes_pulled_tokens;
            const double t0 = now_s();
            XDS_RETURN_IF_ERROR(ex->dispatch(T, ids, w, map, key, false, form));
            const double t1 = now_s();
            // Not timed (as on the Open MPI side): the "experts" (output = input row), which
            // gather their inputs through row(r) and either write one output row per (token,
            // local expert) or pre-sum them per (token, source) in their epilogue.
            const Exchange& cex = *ex;
            const auto& rows = cex.received().rows;
            if (in_combine) {
              for (int r = 0; r < cex.received().n_rows(); ++r)
                std::memcpy(ex->expert_out() + size_t(r) * size_t(H), cex.row(r), size_t(H) * 2);
            } else {
              XDS_RETURN_IF_ERROR(ex->wait_vectors_free());
              std::vector<std::vector<int>> unit_rows(size_t(cex.n_units()));
              for (int r = 0; r < cex.received().n_rows(); ++r)
                unit_rows[cex.unit_of(r)].push_back(r);
              std::vector<const uint16_t*> terms;
              std::vector<float> tw;
              for (int u = 0; u < cex.n_units(); ++u) {
                terms.clear();
                tw.clear();
                for (int r : unit_rows[size_t(u)]) {
                  terms.push_back(cex.row(r));
                  tw.push_back(rows[size_t(r)].weight);
                }
                weighted_sum_bf16(terms.data(), tw.data(), int(terms.size()), H,
                                  ex->presum_vector(uint32_t(u)));
              }
            }
            // Both devices enter combine together (as in dispatch, and as the Open MPI side
            // does): the other device's untimed expert work is not timed as a wait here.
            XDS_RETURN_IF_ERROR(barrier(mb, peers, key ^ (uint64_t(1) << 62),
                                        WaitCtx{OpKind::kBarrier, deadline_after_ms(600'000)}));
            const double t1b = now_s();
            XDS_RETURN_IF_ERROR(in_combine ? ex->combine(y.data(), key)
                                           : ex->combine_presummed(y.data(), key));
            const double t2 = now_s();
            if (it >= 3) {
              tin.push_back(t0 - ti);
              td.push_back(t1 - t0);
              tc.push_back(t2 - t1b);
              bytes = ex->stats().bytes_pulled_tokens - b0;
            }
          }
          if (me == 0)
            jsonl(out, "{\"bench\":\"moe\",\"impl\":\"xccl\",\"world\":2,\"tokens\":" +
                           std::to_string(T) + ",\"hidden\":" + std::to_string(H) +
                           ",\"dtype\":\"" + (int8 ? "int8" : "bf16") + "\",\"quant\":\"" +
                           (producer ? "producer" : "dispatch") + "\",\"presum\":\"" +
                           presum + "\",\"dispatch_us\":" + std::to_string(median(td) * 1e6) +
                           ",\"combine_us\":" + std::to_string(median(tc) * 1e6) +
                           ",\"dispatch_min_us\":" + std::to_string(min_of(td) * 1e6) +
                           ",\"combine_min_us\":" + std::to_string(min_of(tc) * 1e6) +
                           ",\"input_copy_us\":" + std::to_string(median(tin) * 1e6) +
                           ",\"dispatch_bytes_pulled\":" + std::to_string(bytes) + "}");
        }
      }
      XDS_RETURN_IF_ERROR(ex->finish());
    }
  }
  return Status::ok_status();
}

int run_devices(const LaunchOptions& o, Status (*fn)(Fabric&, const char*, bool), const char* out,
                bool quick) {
  auto r = launch_devices(o, [&](Fabric& f) {
    Status st = fn(f, out, quick);
    if (!st.ok()) std::fprintf(stderr, "device %d: %s\n", f.rank(), st.to_string().c_str());
    return st.ok() ? 0 : 1;
  });
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
    return 1;
  }
  for (const auto& e : *r)
    if (!e.ok()) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : "xccl.jsonl";
  const bool quick = argc > 2 && std::string(argv[2]) == "--quick";
  const std::string only = argc > 3 ? argv[3] : "";  // memcpy | p2p | moe | lat ROUND
  if (only == "lat") g_lat_round = argc > 4 ? std::atoi(argv[4]) : 0;
  if (only.empty() || only == "memcpy") bench_memcpy(out, quick);
  LaunchOptions o;
  o.devices = 2;
  o.cpus = {0, 1};
  o.arena.lanes = 4;
  o.arena.ring_slots = 4;
  o.arena.slot_bytes = 256 * 1024;
  o.arena.app_bytes = size_t(64) << 20;
  o.arena.staging_bytes = 4096;
  if ((only.empty() || only == "p2p") && run_devices(o, p2p_device, out, quick) != 0) return 1;
  if (only == "lat") return run_devices(o, lat_device, out, quick);
  o.arena.app_bytes = 0;
  o.arena.staging_bytes = moe_staging_bytes(moe_cfg(7168, true), 2);
  if ((only.empty() || only == "moe") && run_devices(o, moe_device, out, quick) != 0) return 1;
  return 0;
}
