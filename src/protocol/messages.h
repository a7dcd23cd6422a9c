// The control messages between the gateway, an instance's shell, its DP groups and their
// output processes (docs/design/flowserve.md, "Messages"): one struct per kind, a `Message`
// is one of them. Each travels in one ZeroMQ frame as a MessagePack map (nlohmann::json::
// to_msgpack) holding the protocol version, the kind's tag and the struct's fields:
//
//   RequestMsg       gateway -> shell -> the DP group it is placed on -> its output process
//   CancelMsg        gateway -> shell; output process (a stop string matched) -> its group
//                    -> shell -> the group that holds the request
//   TokensMsg        DP group -> its output process
//   OutputMsg        output process -> gateway
//   LoadMsg          DP group -> shell (its own load); shell -> gateways (every group's)
//   WakeMsg          shell -> every DP group; a sleeping group that holds work -> shell
//   ShutdownMsg      gateway -> shell -> DP groups -> output processes: drain and stop
//   PingMsg/PongMsg  health: gateway -> shell -> every group; a pong back once all answered
//   RejectedMsg      shell -> gateway: the request cannot be placed (now, or ever)
//   EplbCommandMsg   shell -> every DP group (serve/eplb_control.h)
//   EplbReportMsg    DP group -> shell
//   AdminRequestMsg  gateway -> shell: an /admin call
//   AdminReplyMsg    shell -> gateway: its answer
//   EplbStatePushMsg shell -> gateways: the EPLB metrics lines, about once a second
//   FailedMsg        shell -> gateways: the instance lost a process; it restarts (recovering)
//                    or cannot serve any more
//   FaultMsg         shell -> a DP group: an injected fault (POST /admin/faults)
//   BlocksMsg        DP group -> shell -> gateways: prefix-cache block-hash events (P096)
//   EndedMsg         DP group -> shell: requests it released (the shell forgets their group)
//   ReformMsg        shell -> each surviving DP group: one phase of a scale-down (P119)
//   ReformedMsg      DP group -> shell: its phase is done (or failed)
//   MembershipMsg    shell -> gateways: a DP group was lost and the instance goes on without
//                    it (the requests it held are to be recomputed), or it joined again
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "protocol/payloads.h"

namespace xds::protocol {

// Carried by every message; decode() refuses a message of another version. Bump it whenever a
// message or payload changes meaning (a field added with a harmless default need not).
inline constexpr int32_t kProtocolVersion = 1;

// What an instance does with the requests it gets (serve --role).
enum class InstanceRole : int32_t { kColocated = 0, kPrefill = 1, kDecode = 2 };
const char* to_string(InstanceRole role);
// "colocated" | "prefill" | "decode"; anything else is an InvalidArgument.
Result<InstanceRole> parse_instance_role(std::string_view text);

// The /admin calls the shell answers.
enum class AdminCall : int32_t {
  kEplbState = 1,      // GET /admin/eplb
  kEplbRebalance = 2,  // POST /admin/eplb/rebalance
  kInjectFault = 3,    // POST /admin/faults (body: the fault, serve/fault_injection.h)
  kListFaults = 4,     // GET /admin/faults
};

struct RequestMsg {
  EngineRequest request;
  // gateway -> shell: the incarnation the gateway addressed (PongMsg::incarnation; 0: any).
  // A shell of another incarnation refuses it (RejectedMsg::stale).
  uint64_t incarnation = 0;
};

struct CancelMsg {
  std::string request_id;
  int32_t index = -1;  // the choice to stop (-1: every choice)
};

struct TokensMsg {
  std::vector<TokenDelta> tokens;
};

struct OutputMsg {
  std::vector<OutputDelta> outputs;
};

struct LoadMsg {
  std::vector<GroupLoad> loads;
  InstanceRole role = InstanceRole::kColocated;  // shell -> gateway: the instance's role
  uint64_t incarnation = 0;  // shell -> gateway: which start of the instance (PongMsg)
};

struct WakeMsg {
  uint64_t seq = 0;    // shell -> groups: the shell's wake sequence number
  int32_t group = -1;  // group -> shell: the group that asks for a new wake
};

struct ShutdownMsg {};

struct PingMsg {
  std::string probe_id;  // gateway -> shell: echoed in the pong
  uint64_t seq = 0;      // shell -> groups: the shell's probe number
};

struct PongMsg {
  std::string probe_id;  // shell -> gateway
  uint64_t seq = 0;      // group -> shell
  int32_t group = -1;    // group -> shell: the answering DP group
  InstanceRole role = InstanceRole::kColocated;  // shell -> gateway
  // shell -> gateway: a number drawn at each start of the instance (a change tells the
  // gateway that the instance restarted and lost every request it held), whether every DP
  // group is up, and if not why ("starting", "recovering: ...").
  uint64_t incarnation = 0;
  bool ready = true;
  std::string state{};
  // group -> shell: the rank of the peer this group waits for inside an XCCL collective
  // (answered from inside the wait), -1 when it waits for nobody.
  int32_t waiting_on = -1;
};

struct RejectedMsg {
  std::string request_id;
  std::string reason;
  // The request can never be placed (larger than any group's KV): the gateway answers 400
  // instead of queueing it.
  bool never = false;
  int32_t attempt = 0;  // EngineRequest::attempt of the refused request
};

struct EplbCommandMsg {
  EplbCommand command;
};

struct EplbReportMsg {
  EplbReport report;
};

struct AdminRequestMsg {
  std::string call_id;
  AdminCall call = AdminCall::kEplbState;
  std::string body{};  // the request's JSON body (kInjectFault)
};

struct AdminReplyMsg {
  std::string call_id;
  int32_t http_status = 200;
  std::string body;  // JSON text
};

struct EplbStatePushMsg {
  std::string metrics_text;  // Prometheus exposition lines for the gateway's /metrics
};

struct FailedMsg {
  std::string reason;
  // True: the instance restarts its processes (a new incarnation follows); the gateway keeps
  // its requests and sends them again, recomputed, once it is back. False: it stops for good.
  bool recovering = false;
  std::string kind{};  // "dead_process" (a process died) or "hang" (a group stopped answering)
};

// An injected fault (serve/fault_injection.h) for one DP group: it strikes after the group has
// run `after_steps` more steps.
struct FaultMsg {
  FaultSpec fault;
};

struct BlocksMsg {
  int32_t group = -1;                   // the DP group whose prefix cache changed
  std::vector<uint64_t> added;          // chain hashes now cached
  std::vector<uint64_t> removed;        // chain hashes evicted
};

struct EndedMsg {
  int32_t group = -1;
  std::vector<std::string> request_ids;
};

// Scale-down and rejoin (P119, docs/design/reliability.md): the survivors of a lost DP
// group -- or they and a group started again -- form a fabric of their own, in three phases
// the shell runs one after the other, each once every member answered the previous one
// (xccl/member_fabric.h):
//   kLeave  stop using the current fabric (after a failed step, rolled back; or at the next
//           step boundary, which every group takes together) and answer;
//   kReset  clear the protocol lines of your own arena and answer;
//   kJoin   form the fabric of `members` under `generation` and answer; then step on from
//           step 0. Maps: map_version 0 -> the maps in force without the lost groups
//           (scale-down); > 0 -> the identity map of every group at that version (rejoin).
enum class ReformPhase : int32_t { kLeave = 1, kReset = 2, kJoin = 3 };
struct ReformMsg {
  ReformPhase phase = ReformPhase::kLeave;
  uint64_t generation = 0;             // 1 for the first scale-down of an incarnation
  std::vector<int32_t> members;        // the DP groups that go on, ascending
  std::vector<int32_t> pids{};         // kJoin: each member's process id (a restarted one's
                                       // is new: its peers watch it from then on)
  uint64_t map_version = 0;            // kJoin: see above
};
struct ReformedMsg {
  int32_t group = -1;
  ReformPhase phase = ReformPhase::kLeave;
  uint64_t generation = 0;
  std::string error{};                 // empty: done
};
struct MembershipMsg {
  int32_t group = -1;                  // the DP group lost, or joined again
  bool joined = false;
  std::string reason{};                // how it was lost
  std::vector<int32_t> members{};      // the DP groups that serve now
  std::vector<std::string> request_ids{};  // placed on the lost group: recompute them
};

using Message = std::variant<RequestMsg, CancelMsg, TokensMsg, OutputMsg, LoadMsg, WakeMsg,
                             ShutdownMsg, PingMsg, PongMsg, RejectedMsg, EplbCommandMsg,
                             EplbReportMsg, AdminRequestMsg, AdminReplyMsg, EplbStatePushMsg,
                             FailedMsg, BlocksMsg, EndedMsg, FaultMsg, ReformMsg, ReformedMsg,
                             MembershipMsg>;

// The wire tag of each kind; never reused.
enum class MessageKind : int32_t {
  kRequest = 1,
  kCancel = 2,
  kTokens = 3,
  kOutput = 4,
  kLoad = 5,
  kWake = 6,
  kShutdown = 7,
  kPing = 8,
  kPong = 9,
  kRejected = 10,
  kEplbCommand = 11,
  kEplbReport = 12,
  kAdminRequest = 13,
  kAdminReply = 14,
  kEplbStatePush = 15,
  kFailed = 16,
  kBlocks = 17,
  kEnded = 18,
  kFault = 19,
  kReform = 20,
  kReformed = 21,
  kMembership = 22,
};
MessageKind kind_of(const Message& m);
// "request", "cancel", ... for log lines.
const char* kind_name(MessageKind kind);

// Message <-> MessagePack bytes. decode() never throws: malformed bytes, a message of another
// protocol version (the error names both) or of an unknown kind is an InvalidArgument.
std::string encode(const Message& m);
Result<Message> decode(const void* data, size_t size);

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RequestMsg, request, incarnation)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(CancelMsg, request_id, index)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TokensMsg, tokens)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OutputMsg, outputs)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LoadMsg, loads, role, incarnation)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(WakeMsg, seq, group)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PingMsg, probe_id, seq)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PongMsg, probe_id, seq, group, role, incarnation,
                                                ready, state, waiting_on)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RejectedMsg, request_id, reason, never, attempt)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EplbCommandMsg, command)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EplbReportMsg, report)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AdminRequestMsg, call_id, call, body)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(AdminReplyMsg, call_id, http_status, body)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EplbStatePushMsg, metrics_text)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FailedMsg, reason, recovering, kind)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FaultMsg, fault)
// ShutdownMsg has no fields (the macros need at least one).
inline void to_json(nlohmann::json& j, const ShutdownMsg&) { j = nlohmann::json::object(); }
inline void from_json(const nlohmann::json&, ShutdownMsg&) {}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BlocksMsg, group, added, removed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(EndedMsg, group, request_ids)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ReformMsg, phase, generation, members, pids,
                                                map_version)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ReformedMsg, group, phase, generation, error)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(MembershipMsg, group, joined, reason, members,
                                                request_ids)

}  // namespace xds::protocol

namespace xds::engine {
using protocol::Message;
}  // namespace xds::engine
