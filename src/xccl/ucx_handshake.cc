#include "xccl/ucx_handshake.h"

#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/clock.h"

namespace xds::xccl {
namespace {

Status errno_status(const std::string& where, const char* what) {
  return internal_error("xccl ucx link {}: {} failed: {}", where, what, std::strerror(errno));
}

Status send_all(int sock, const void* data, size_t n, int64_t deadline, const std::string& where) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    XDS_RETURN_IF_ERROR(ucx_wait_fd(sock, POLLOUT, deadline, where, "room to send the handshake"));
    const ssize_t k = send(sock, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return errno_status(where, "send(handshake)");
    p += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

void append(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

}  // namespace

Status ucx_wait_fd(int fd, short events, int64_t deadline_ns, const std::string& where,
                   const char* what) {
  while (true) {
    const int64_t left_ms = (deadline_ns - now_ns()) / 1'000'000;
    if (left_ms <= 0) return deadline_exceeded("xccl ucx link {}: no {} in time", where, what);
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (r > 0) return {};
    if (r < 0 && errno != EINTR) return errno_status(where, "poll");
  }
}

UcxProof ucx_proof(const LinkSecret& secret, int prover, uint32_t epoch,
                   const uint8_t (&nonce0)[kNonceBytes], const uint8_t (&nonce1)[kNonceBytes]) {
  const uint32_t who = static_cast<uint32_t>(prover);
  crypto_generichash_state st;
  crypto_generichash_init(&st, secret.data(), secret.size(), kProofBytes);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kProofLabel),
                            sizeof(kProofLabel) - 1);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(&who), sizeof(who));
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(&epoch), sizeof(epoch));
  crypto_generichash_update(&st, nonce0, kNonceBytes);
  crypto_generichash_update(&st, nonce1, kNonceBytes);
  UcxProof out{};
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

UcxHandshake::UcxHandshake(int sock, int rank, std::string peer, int64_t deadline_ns)
    : sock_(sock), rank_(rank), peer_(std::move(peer)), deadline_ns_(deadline_ns) {}

UcxHandshake::~UcxHandshake() {
  link_.reset();
  if (sock_ >= 0) close(sock_);
}

const char* UcxHandshake::waiting_for() const {
  switch (phase_) {
    case Phase::kChallenge:
      return "challenge from the peer";
    case Phase::kProof:
      return "proof of the cluster secret from the peer";
    case Phase::kHello:
    case Phase::kBlobs:
      return "hello from the peer";
    default:
      return "handshake";
  }
}

OpState UcxHandshake::fail(Status st) {
  phase_ = Phase::kFailed;
  status_ = std::move(st);
  draft_.reset();  // deregisters whatever was registered; nothing of it was sent
  return OpState::kFailed;
}

Status UcxHandshake::start(const UcxLinkOptions& o) {
  if (!o.secret) {
    return invalid_argument(
        "xccl ucx link {}: no cluster secret (UcxLinkOptions::secret): a UCX link proves it "
        "to its peer before any memory key is handed out",
        peer_);
  }
  if (sodium_init() < 0) return internal_error("xccl ucx link: libsodium failed to initialise");
  mine_ = {kChallengeMagic, kUcxLinkVersion, rank_, o.epoch, 0, {}};
  randombytes_buf(mine_.nonce, kNonceBytes);
  in_.assign(sizeof(UcxChallenge), 0);
  have_ = 0;
  return send_all(sock_, &mine_, sizeof(mine_), deadline_ns_, peer_);
}

OpState UcxHandshake::fill() {
  while (have_ < in_.size()) {
    const ssize_t k = recv(sock_, in_.data() + have_, in_.size() - have_, MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return OpState::kInProgress;
    if (k < 0) return fail(errno_status(peer_, "recv(handshake)"));
    if (k == 0) {
      // Rank 1 that sent its proof and sees the connection closed: rank 0 refused the proof.
      const bool refused = rank_ == 1 && phase_ == Phase::kProof;
      return fail(unavailable(
          "xccl ucx link {}: the peer closed the connection while this side waited for the {}{}",
          peer_, waiting_for(),
          refused ? " (it refuses a peer that does not prove the cluster secret: do both sides "
                    "read the same --cluster-secret-file?)"
                  : ""));
    }
    have_ += static_cast<size_t>(k);
  }
  return OpState::kDone;
}

OpState UcxHandshake::advance(const UcxLinkOptions& o) {
  while (phase_ != Phase::kDone && phase_ != Phase::kFailed) {
    const OpState got = fill();
    if (got != OpState::kDone) return got;
    Status st;
    switch (phase_) {
      case Phase::kChallenge:
        st = on_challenge(o);
        break;
      case Phase::kProof:
        st = on_proof(o);
        break;
      case Phase::kHello:
        st = on_hello_header();
        break;
      default:
        st = on_blobs();
        break;
    }
    if (!st.ok()) return fail(std::move(st));
  }
  return phase_ == Phase::kDone ? OpState::kDone : OpState::kFailed;
}

// The peer's challenge: its identity and nonce. Rank 1 proves the secret at once.
Status UcxHandshake::on_challenge(const UcxLinkOptions& o) {
  std::memcpy(&theirs_, in_.data(), sizeof(theirs_));
  if (theirs_.magic != kChallengeMagic) {
    return failed_precondition(
        "xccl ucx link {}: the peer is not an xccl ucx link (its first bytes read {:#x})", peer_,
        theirs_.magic);
  }
  if (theirs_.version != kUcxLinkVersion) {
    return failed_precondition(
        "xccl ucx link {}: the peer speaks ucx link version {}, this side {}", peer_,
        theirs_.version, kUcxLinkVersion);
  }
  if (theirs_.rank != 1 - rank_) {
    return failed_precondition("xccl ucx link {}: the peer says it is rank {}, expected {}", peer_,
                               theirs_.rank, 1 - rank_);
  }
  if (theirs_.epoch != o.epoch) {
    return invalid_argument("xccl ucx link {}: the peer's epoch is {}, this side's {}", peer_,
                            theirs_.epoch, o.epoch);
  }
  if (rank_ == 1) {
    const UcxProof p = ucx_proof(*o.secret, 1, o.epoch, theirs_.nonce, mine_.nonce);
    XDS_RETURN_IF_ERROR(send_all(sock_, p.data(), p.size(), deadline_ns_, peer_));
  }
  phase_ = Phase::kProof;
  in_.assign(kProofBytes, 0);
  have_ = 0;
  return {};
}

// The peer's proof. Checked in constant time; only a peer that proved the secret gets this
// side's proof (rank 0) and hello.
Status UcxHandshake::on_proof(const UcxLinkOptions& o) {
  const uint8_t(&nonce0)[kNonceBytes] = rank_ == 0 ? mine_.nonce : theirs_.nonce;
  const uint8_t(&nonce1)[kNonceBytes] = rank_ == 0 ? theirs_.nonce : mine_.nonce;
  const UcxProof want = ucx_proof(*o.secret, 1 - rank_, o.epoch, nonce0, nonce1);
  if (sodium_memcmp(want.data(), in_.data(), kProofBytes) != 0) {
    return failed_precondition(
        "xccl ucx link {}: the peer did not prove the cluster secret (a different "
        "--cluster-secret-file?); it was sent nothing but this side's challenge",
        peer_);
  }
  if (rank_ == 0) {
    const UcxProof p = ucx_proof(*o.secret, 0, o.epoch, nonce0, nonce1);
    XDS_RETURN_IF_ERROR(send_all(sock_, p.data(), p.size(), deadline_ns_, peer_));
  }
  XDS_RETURN_IF_ERROR(send_hello(o));
  phase_ = Phase::kHello;
  in_.assign(sizeof(UcxHello), 0);
  have_ = 0;
  return {};
}

// Arena, worker, registrations -- now that the peer is known -- and the hello.
Status UcxHandshake::send_hello(const UcxLinkOptions& o) {
  XDS_ASSIGN_OR_RETURN(draft_, ucx_link_draft(rank_, o, peer_));
  const UcxPacked& mine = draft_->packed();
  std::vector<uint8_t> out;
  append(out, &draft_->hello(), sizeof(UcxHello));
  append(out, mine.worker_address.data(), mine.worker_address.size());
  append(out, mine.arena.rkey.data(), mine.arena.rkey.size());
  append(out, mine.region.rkey.data(), mine.region.rkey.size());
  return send_all(sock_, out.data(), out.size(), deadline_ns_, peer_);
}

// The hello's fixed part: how many blob bytes follow.
Status UcxHandshake::on_hello_header() {
  std::memcpy(&their_hello_, in_.data(), sizeof(their_hello_));
  const UcxHello& t = their_hello_;
  if (t.magic != kHelloMagic) {
    return failed_precondition(
        "xccl ucx link {}: the peer's hello is not an xccl ucx hello (magic {:#x})", peer_,
        t.magic);
  }
  if (t.worker_address_bytes == 0 || t.worker_address_bytes > kMaxBlobBytes ||
      t.arena_rkey_bytes == 0 || t.arena_rkey_bytes > kMaxBlobBytes ||
      t.region_rkey_bytes > kMaxBlobBytes || (t.region_rkey_bytes == 0) != (t.region_bytes == 0)) {
    return failed_precondition(
        "xccl ucx link {}: the peer's hello is malformed (address {} bytes, rkeys {} and {} "
        "bytes, region {} bytes)",
        peer_, t.worker_address_bytes, t.arena_rkey_bytes, t.region_rkey_bytes, t.region_bytes);
  }
  phase_ = Phase::kBlobs;
  in_.assign(size_t{t.worker_address_bytes} + t.arena_rkey_bytes + t.region_rkey_bytes, 0);
  have_ = 0;
  return {};
}

// The hello's blobs: the peer's worker address and rkeys. The draft checks the rest and
// connects.
Status UcxHandshake::on_blobs() {
  const UcxHello& t = their_hello_;
  UcxPacked theirs;
  const uint8_t* p = in_.data();
  theirs.worker_address.assign(p, p + t.worker_address_bytes);
  p += t.worker_address_bytes;
  theirs.arena = {t.arena_base, t.arena_bytes, std::vector<uint8_t>(p, p + t.arena_rkey_bytes)};
  p += t.arena_rkey_bytes;
  theirs.region = {t.region_base, t.region_bytes, std::vector<uint8_t>(p, p + t.region_rkey_bytes)};
  XDS_ASSIGN_OR_RETURN(link_, draft_->finish(t, theirs, sock_));
  sock_ = -1;  // the link's now
  draft_.reset();
  phase_ = Phase::kDone;
  return {};
}

}  // namespace xds::xccl
