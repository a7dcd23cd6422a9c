// The rendezvous of a UCX link (ucx_link.h) over its TCP socket, internal to xds_xccl_ucx:
// the messages on the wire, the proof of the cluster secret, and UcxHandshake, one side's
// state machine, advanced as the peer's bytes arrive. ucx_link.cc builds the link itself
// (UcxLinkDraft) once the peer has proved the secret.
//
// Wire (host byte order, both sides x86-64), in the order each side sends:
//   rank 1 (connecting)            rank 0 (listening)
//   UcxChallenge ----------------> <---------------- UcxChallenge   (both at once)
//   proof(1) -------------------->                   rank 0 checks proof(1): wrong -> it closes
//                                 <---------------- proof(0) | UcxHello | address | rkeys
//   rank 1 checks proof(0)
//   UcxHello | address | rkeys -->
// proof(r) = BLAKE2b-256 keyed with the cluster secret over
//   kProofLabel | r (u32) | epoch (u32) | nonce of rank 0 (32 B) | nonce of rank 1 (32 B)
// Fresh nonces from both sides make an old proof useless (no replay); the prover's rank makes
// rank 0's proof useless as rank 1's (no reflection); the epoch binds the link's epoch. Rank 0
// (the side that lends its KV cache) says nothing but its challenge until rank 1 has proved
// the secret, and neither side creates its UCX worker or registers memory before the peer's
// proof checked out.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "xccl/layout.h"
#include "xccl/transport.h"
#include "xccl/ucx_link.h"
#include "xccl/ucx_worker.h"

namespace xds::xccl {

inline constexpr uint64_t kChallengeMagic = 0x4854554158435558ull;  // "XUCXAUTH"
inline constexpr uint64_t kHelloMagic = 0x4b4e494c58435558ull;      // "XUCXLINK"
inline constexpr uint32_t kUcxLinkVersion = 2;      // of the challenge and the hello
inline constexpr uint32_t kMaxBlobBytes = 1 << 16;  // a worker address or a packed rkey
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;
inline constexpr char kProofLabel[] = "xdeepserve ucx link proof v1";  // without its NUL

// Sent first by both sides.
struct UcxChallenge {
  uint64_t magic;  // kChallengeMagic
  uint32_t version;
  int32_t rank;
  uint32_t epoch;
  uint32_t pad;
  uint8_t nonce[kNonceBytes];  // randombytes_buf, new for every connection
};
static_assert(sizeof(UcxChallenge) == 56);

// Sent once the peer proved the secret; the three blobs follow in this order.
struct UcxHello {
  uint64_t magic;  // kHelloMagic
  uint32_t version;
  int32_t rank;
  uint32_t epoch;
  uint32_t pad;
  ArenaConfig config;
  uint64_t arena_base, arena_bytes;
  uint64_t region_base, region_bytes;  // 0, 0: no exported region
  uint32_t worker_address_bytes, arena_rkey_bytes, region_rkey_bytes, pad2;
};

// Waits for `events` on fd; DeadlineExceeded naming `what` and `where` after the deadline.
Status ucx_wait_fd(int fd, short events, int64_t deadline_ns, const std::string& where,
                   const char* what);

using UcxProof = std::array<uint8_t, kProofBytes>;
// proof(prover) above. Pure.
UcxProof ucx_proof(const LinkSecret& secret, int prover, uint32_t epoch,
                   const uint8_t (&nonce0)[kNonceBytes], const uint8_t (&nonce1)[kNonceBytes]);

// This side of a link after the peer proved the secret (ucx_link.cc): arena allocated and
// initialised, UCX worker created, arena and exported region registered.
class UcxLinkDraft {
 public:
  virtual ~UcxLinkDraft() = default;
  virtual const UcxHello& hello() const = 0;  // this side's, blob sizes filled in
  virtual const UcxPacked& packed() const = 0;
  // Checks the peer's hello (version, rank, epoch, arena config and size) and connects to
  // its worker. On success the link owns `sock` (its EOF is the peer's death); on failure the
  // caller still does.
  virtual Result<std::unique_ptr<UcxLink>> finish(const UcxHello& theirs, const UcxPacked& blobs,
                                                  int sock) = 0;
};
Result<std::unique_ptr<UcxLinkDraft>> ucx_link_draft(int rank, const UcxLinkOptions& o,
                                                     const std::string& peer);

// One side's rendezvous on a connected, non-blocking TCP socket (which it owns until the link
// takes it). start() sends the challenge; advance() reads what has arrived -- never waiting
// for more -- and goes as far as it can. Sends may wait (until the deadline) for room in the
// socket: the challenge and the proof always fit an empty socket buffer; the hello goes only
// to a peer that proved the secret.
class UcxHandshake {
 public:
  // `peer` ("host:port") names the peer in errors.
  UcxHandshake(int sock, int rank, std::string peer, int64_t deadline_ns);
  ~UcxHandshake();
  UcxHandshake(const UcxHandshake&) = delete;
  UcxHandshake& operator=(const UcxHandshake&) = delete;

  Status start(const UcxLinkOptions& o);
  // kInProgress: waiting for the peer's bytes; kDone: take_link(); kFailed: status().
  OpState advance(const UcxLinkOptions& o);
  std::unique_ptr<UcxLink> take_link() { return std::move(link_); }
  const Status& status() const { return status_; }

  int sock() const { return sock_; }
  int64_t deadline_ns() const { return deadline_ns_; }
  const std::string& peer() const { return peer_; }
  // What this side waits for now ("challenge from the peer", ...), for timeouts.
  const char* waiting_for() const;

 private:
  enum class Phase : uint8_t { kChallenge, kProof, kHello, kBlobs, kDone, kFailed };
  OpState fail(Status st);
  // Reads towards want_ bytes in in_: kDone once there, kFailed at EOF or an error.
  OpState fill();
  Status on_challenge(const UcxLinkOptions& o);
  Status on_proof(const UcxLinkOptions& o);
  Status send_hello(const UcxLinkOptions& o);
  Status on_hello_header();
  Status on_blobs();

  int sock_;
  int rank_;
  std::string peer_;
  int64_t deadline_ns_;
  Phase phase_ = Phase::kChallenge;
  std::vector<uint8_t> in_;  // [want_] bytes of the message read so far
  size_t have_ = 0;
  UcxChallenge mine_{};
  UcxChallenge theirs_{};
  UcxHello their_hello_{};
  std::unique_ptr<UcxLinkDraft> draft_;
  std::unique_ptr<UcxLink> link_;
  Status status_;
};

}  // namespace xds::xccl
