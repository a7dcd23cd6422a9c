// Open MPI baseline for bench/xccl: MPI_Send/Recv ping-pong, and dispatch/combine written the
// usual way. Timed, per step, with the same routing and data as the XCCL bench:
//   dispatch: per-destination token lists, Alltoall of counts, pack (row + 104-byte route
//     metadata, once per (token, device), self included), Alltoallv, and the per-local-expert
//     (row, weight) table built from the metadata (what XCCL's received() gives).
//   combine:  [presum "combine": pre-sum every received row over its local experts' outputs
//     with XCCL's row kernel], Alltoallv of one vector per (token, device) back, per-token sum
//     with the same kernel.
// Not timed, on both sides: the "experts" (output = input row), and with presum "experts"
// the pre-sum in their epilogue. Both sides pass a barrier before dispatch and before combine. Run by run.sh:
//   mpirun --allow-run-as-root -np 2 --bind-to core --map-by core --mca btl self,vader
//          xccl_mpi_bench OUT.jsonl [--quick] [lat ROUND]
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "xccl/rowops.h"  // the same row kernel (weighted bf16 sums) as XCCL's combine

namespace {

using namespace xbench;

inline uint16_t tobf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

void p2p(int rank, const char* out, bool quick) {
  for (size_t n : p2p_sizes(quick)) {
    ColdPool sp(n), rp(n);
    const int iters = iterations_for(n, quick) + 2;
    std::vector<double> samples;  // one-way = round trip / 2; the first two warm up
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters; ++i) {
      const double t0 = now_s();
      if (rank == 0) {
        MPI_Send(sp.get(), int(n), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(rp.get(), int(n), MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(rp.get(), int(n), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(sp.get(), int(n), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
      }
      if (i >= 2) samples.push_back((now_s() - t0) / 2);
    }
    const double one_way = median(samples);
    if (rank == 0)
      jsonl(out, "{\"bench\":\"p2p\",\"impl\":\"openmpi\",\"bytes\":" + std::to_string(n) +
                     ",\"lanes\":0,\"one_way_us\":" + std::to_string(one_way * 1e6) +
                     ",\"one_way_min_us\":" + std::to_string(min_of(samples) * 1e6) +
                     ",\"gbps\":" + std::to_string(double(n) / one_way / 1e9) + "}");
  }
}

// One interleaved latency round: 8 B ping-pong, 20000 round trips (as xccl_bench lat).
void lat(int rank, const char* out, int round) {
  char sbuf[8] = {}, rbuf[8];
  std::vector<double> samples;
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < 20'002; ++i) {
    const double t0 = now_s();
    if (rank == 0) {
      MPI_Send(sbuf, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(rbuf, 8, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(rbuf, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(sbuf, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    if (i >= 2) samples.push_back((now_s() - t0) / 2);
  }
  if (rank == 0)
    jsonl(out, "{\"bench\":\"lat\",\"impl\":\"openmpi\",\"bytes\":8,\"round\":" +
                   std::to_string(round) + ",\"one_way_us\":" + std::to_string(median(samples) * 1e6) +
                   ",\"one_way_min_us\":" + std::to_string(min_of(samples) * 1e6) + "}");
}

constexpr int kMeta = 104;  // token index, local expert list, weights (XCCL's RouteEntry)

// Pre-sums every received row over its local experts' outputs (pair_row[r] + j) into
// back [n_recv][H] with the same row kernel as XCCL's combine.
void presum_rows(const unsigned char* recv, size_t row, int H, int n_recv,
                 const uint16_t* expert_out, const uint32_t* pair_row, uint16_t* back) {
  const uint16_t* terms[16];
  float tw[16];
  for (int r = 0; r < n_recv; ++r) {
    int32_t meta[kMeta / 4];
    std::memcpy(meta, recv + size_t(r) * row + size_t(H) * 2, kMeta);
    for (int j = 0; j < meta[1]; ++j) {
      std::memcpy(&tw[j], &meta[10 + j], 4);
      terms[j] = expert_out + (size_t(pair_row[r]) + size_t(j)) * size_t(H);
    }
    xds::xccl::weighted_sum_bf16(terms, tw, meta[1], H, back + size_t(r) * size_t(H));
  }
}

// One dispatch + combine with the same routing as the XCCL bench (n_experts split evenly).
void moe(int rank, int world, const char* out, bool quick) {
  const int K = 8, n_experts = 256, per_dev = n_experts / world;
  for (int H : {2048, 7168}) {
    for (int T : moe_token_counts())
    for (const char* presum : {"combine", "experts"}) {
      const bool in_combine = presum[0] == 'c';
      std::vector<int32_t> ids;
      std::vector<float> wts;
      make_routing(rank, T, K, n_experts, ids, wts);
      std::vector<uint16_t> x(static_cast<size_t>(T) * static_cast<size_t>(H));
      for (size_t i = 0; i < x.size(); ++i) x[i] = tobf(float(int(mix(i) % 200) - 100) / 50.f);
      const size_t row = size_t(H) * 2 + kMeta;
      std::vector<unsigned char> sendbuf, recvbuf;
      std::vector<uint16_t> back_send, back_recv, expert_out,
          result(static_cast<size_t>(T) * static_cast<size_t>(H));
      std::vector<uint32_t> pair_row;                  // [received rows + 1]
      std::vector<int> expert_offset;                 // [per_dev + 1]
      std::vector<std::pair<int, float>> table;       // [rows] (received row, weight)
      const int iters = quick ? 10 : 40;
      std::vector<double> td, tc;
      for (int it = 0; it < iters + 3; ++it) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = now_s();
        // dispatch: per destination, the tokens that have an expert there (once per device)
        std::vector<int> scount(static_cast<size_t>(world), 0), rcount(static_cast<size_t>(world));
        std::vector<std::vector<int>> dest_tokens(static_cast<size_t>(world));
        for (int t = 0; t < T; ++t) {
          unsigned mask = 0;
          for (int j = 0; j < K; ++j) mask |= 1u << (ids[size_t(t * K + j)] / per_dev);
          for (int d = 0; d < world; ++d)
            if (mask & (1u << d)) dest_tokens[size_t(d)].push_back(t);
        }
        for (int d = 0; d < world; ++d) scount[size_t(d)] = int(dest_tokens[size_t(d)].size());
        MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, MPI_COMM_WORLD);
        const size_t W = static_cast<size_t>(world);
        std::vector<int> sb(W), sd(W), rb(W), rd(W);
        int so = 0, ro = 0;
        for (int d = 0; d < world; ++d) {
          sb[size_t(d)] = scount[size_t(d)] * int(row);
          sd[size_t(d)] = so;
          so += sb[size_t(d)];
          rb[size_t(d)] = rcount[size_t(d)] * int(row);
          rd[size_t(d)] = ro;
          ro += rb[size_t(d)];
        }
        sendbuf.resize(size_t(so));
        recvbuf.resize(size_t(ro));
        unsigned char* p = sendbuf.data();
        for (int d = 0; d < world; ++d)
          for (int t : dest_tokens[size_t(d)]) {  // pack: row + routing metadata
            std::memcpy(p, x.data() + size_t(t) * size_t(H), size_t(H) * 2);
            int32_t meta[kMeta / 4] = {t};
            int n_local = 0;
            for (int j = 0; j < K; ++j)
              if (ids[size_t(t * K + j)] / per_dev == d) {
                meta[2 + n_local] = ids[size_t(t * K + j)] % per_dev;
                std::memcpy(&meta[10 + n_local], &wts[size_t(t * K + j)], 4);
                ++n_local;
              }
            meta[1] = n_local;
            std::memcpy(p + size_t(H) * 2, meta, kMeta);
            p += row;
          }
        MPI_Alltoallv(sendbuf.data(), sb.data(), sd.data(), MPI_BYTE, recvbuf.data(), rb.data(),
                      rd.data(), MPI_BYTE, MPI_COMM_WORLD);
        // "grouped by local expert", as XCCL delivers it: a per-local-expert table of
        // (received row, weight) built from the metadata (the expert GEMM gathers by it).
        {
          const int n_in = ro / int(row);
          expert_offset.assign(size_t(per_dev) + 1, 0);
          for (int r = 0; r < n_in; ++r) {
            int32_t meta[kMeta / 4];
            std::memcpy(meta, recvbuf.data() + size_t(r) * row + size_t(H) * 2, kMeta);
            for (int j = 0; j < meta[1]; ++j) ++expert_offset[size_t(meta[2 + j]) + 1];
          }
          for (int e = 0; e < per_dev; ++e) expert_offset[size_t(e) + 1] += expert_offset[size_t(e)];
          table.resize(size_t(expert_offset.back()));
          std::vector<int> cur(expert_offset.begin(), expert_offset.end() - 1);
          for (int r = 0; r < n_in; ++r) {
            int32_t meta[kMeta / 4];
            std::memcpy(meta, recvbuf.data() + size_t(r) * row + size_t(H) * 2, kMeta);
            for (int j = 0; j < meta[1]; ++j) {
              float w;
              std::memcpy(&w, &meta[10 + j], 4);
              table[size_t(cur[size_t(meta[2 + j])]++)] = {r, w};
            }
          }
        }
        const double t1 = now_s();
        // Not timed (as on the XCCL side): the "experts" write one output row per (token,
        // local expert), in received-row order: pair_row[r] is row r's first output.
        const int n_recv = ro / int(row);
        size_t n_pairs = 0;
        pair_row.resize(size_t(n_recv) + 1);
        for (int r = 0; r < n_recv; ++r) {
          int32_t nl;
          std::memcpy(&nl, recvbuf.data() + size_t(r) * row + size_t(H) * 2 + 4, 4);
          pair_row[size_t(r)] = uint32_t(n_pairs);
          n_pairs += size_t(nl);
        }
        if (expert_out.size() < n_pairs * size_t(H)) expert_out.resize(n_pairs * size_t(H));
        for (const auto& [r, w] : table)
          std::memcpy(expert_out.data() + size_t(pair_row[size_t(r)]) * size_t(H),
                      recvbuf.data() + size_t(r) * row, size_t(H) * 2);
        back_send.resize(size_t(n_recv) * size_t(H));
        const uint16_t* terms[16];
        float tw[16];
        if (!in_combine)  // the experts' epilogue pre-sums (not timed, as on the XCCL side)
          presum_rows(recvbuf.data(), row, H, n_recv, expert_out.data(), pair_row.data(),
                      back_send.data());
        MPI_Barrier(MPI_COMM_WORLD);  // both ranks enter combine together (as XCCL's bench)
        const double t1b = now_s();
        // combine: pre-sum each received token over its local experts' outputs (the same
        // row kernel as XCCL's) unless the experts did, send back, sum per token.
        if (in_combine)
          presum_rows(recvbuf.data(), row, H, n_recv, expert_out.data(), pair_row.data(),
                      back_send.data());
        back_recv.resize(size_t(so / int(row)) * size_t(H));
        std::vector<int> bsb(W), bsd(W), brb(W), brd(W);
        for (int d = 0; d < world; ++d) {
          bsb[size_t(d)] = rcount[size_t(d)] * H * 2;
          bsd[size_t(d)] = rd[size_t(d)] / int(row) * H * 2;
          brb[size_t(d)] = scount[size_t(d)] * H * 2;
          brd[size_t(d)] = sd[size_t(d)] / int(row) * H * 2;
        }
        MPI_Alltoallv(back_send.data(), bsb.data(), bsd.data(), MPI_BYTE, back_recv.data(),
                      brb.data(), brd.data(), MPI_BYTE, MPI_COMM_WORLD);
        // per token, sum its vectors (one per device) in f32, as XCCL's gather does
        std::vector<std::vector<uint32_t>> tok_rows(static_cast<size_t>(T));
        uint32_t r = 0;
        for (int d = 0; d < world; ++d)
          for (int t : dest_tokens[size_t(d)]) tok_rows[size_t(t)].push_back(r++);
        for (int t = 0; t < T; ++t) {
          int n = 0;
          for (uint32_t k : tok_rows[size_t(t)]) {
            terms[n] = back_recv.data() + size_t(k) * size_t(H);
            tw[n++] = 1.f;
          }
          xds::xccl::weighted_sum_bf16(terms, tw, n, H, result.data() + size_t(t) * size_t(H));
        }
        const double t2 = now_s();
        if (it >= 3) {
          td.push_back(t1 - t0);
          tc.push_back(t2 - t1b);
        }
      }
      if (rank == 0)
        jsonl(out, "{\"bench\":\"moe\",\"impl\":\"openmpi\",\"world\":" + std::to_string(world) +
                       ",\"tokens\":" + std::to_string(T) + ",\"hidden\":" + std::to_string(H) +
                       ",\"dtype\":\"bf16\",\"presum\":\"" + presum + "\",\"dispatch_us\":" + std::to_string(median(td) * 1e6) +
                       ",\"combine_us\":" + std::to_string(median(tc) * 1e6) +
                       ",\"dispatch_min_us\":" + std::to_string(min_of(td) * 1e6) +
                       ",\"combine_min_us\":" + std::to_string(min_of(tc) * 1e6) + "}");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char* out = argc > 1 ? argv[1] : "mpi.jsonl";
  const bool quick = argc > 2 && std::string(argv[2]) == "--quick";
  if (argc > 3 && std::string(argv[3]) == "lat") {  // interleaved latency round (run.sh)
    if (world == 2) lat(rank, out, argc > 4 ? std::atoi(argv[4]) : 0);
    MPI_Finalize();
    return 0;
  }
  if (world == 2) p2p(rank, out, quick);
  moe(rank, world, out, quick);
  MPI_Finalize();
  return 0;
}
