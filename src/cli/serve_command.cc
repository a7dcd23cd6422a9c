// `xdeepserve serve`, `instance` and `gateway`: the OpenAI-compatible server, whole or in
// parts (docs/design/flowserve.md). `serve` runs the gateway in this process and starts one
// colocated instance as a child process that dies with it.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/process_name.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "protocol/channel_security.h"
#include "serve/gateway.h"
#include "serve/instance.h"

namespace xds::cli {
namespace {

// "512M", "2G", "1024K", "1000000" -> bytes; InvalidArgument naming the flag otherwise.
Result<int64_t> parse_size(const std::string& flag, const std::string& text) {
  if (text.empty()) return invalid_argument("{}: empty size", flag);
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return invalid_argument("{}: '{}' is not a size (e.g. 512M, 4G)", flag, text);
  }
  double mult = 1;
  const std::string suffix = text.substr(used);
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    return invalid_argument("{}: unknown suffix in '{}' (K, M or G)", flag, text);
  if (!(v > 0) || v * mult > 9.0e18) return invalid_argument("{}: '{}' must be > 0", flag, text);
  return static_cast<int64_t>(v * mult);
}

struct EngineArgs {
  std::string model;
  int dp = 1;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  std::string kv_memory = "1G";
  int64_t max_model_len = 0;
  std::string compute_dtype = "f32";
  std::string kv_cache_dtype = "auto";
  std::string activation_dtype = "auto";
  int threads_per_device = 0;
  bool no_prefix_cache = false;
  bool no_chunked_prefill = false;
  double kv_reserve_ratio = 1.0;
  SpeculativeFlags speculative;
  int redundant_slots = 0;
  double eplb_window_s = 60;
  int eplb_slices = 8;
  double eplb_interval_s = 0;
  double kv_transfer_timeout_s = 60;
  std::string kv_transfer_host;
  std::string kv_transfer_backend = "auto";
  int max_restarts = 3;
  double restart_window_s = 600;
  int64_t group_heartbeat_interval_ms = 500;
  double group_timeout_s = 3;
  bool fault_injection = false;
  bool no_scale_down = false;
  bool expert_backup = false;
  // MoE/attention disaggregation: attention DP groups and expert devices (0: off).
  int attention_dp = 0;
  int expert_devices = 0;
  int dp_domains = 1;
  int microbatches = 1;
  std::string ae_trace_dir;
  bool no_trampoline = false;
  CLI::Option* dp_option = nullptr;  // to tell a given --dp from its default
  // Not a flag: the cluster secret init_channel_keys() read (or drew); the DP groups' UCX KV
  // links prove it to each other.
  std::optional<protocol::ClusterSecret> cluster_secret;
};

struct GatewayArgs {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  std::string chat_template;
  std::string generation_config = "auto";
  std::string reasoning_parser;
  std::string tool_call_parser;
  bool trust_request_special_tokens = false;
  int64_t max_queue = 1024;
  int64_t long_prompt_tokens = 2048;
  int64_t instance_heartbeat_ms = 1000;
  int64_t instance_timeout_s = 10;
  int64_t recovery_timeout_s = 120;
  int64_t shutdown_timeout_s = 60;
};

void add_engine_flags(CLI::App* cmd, EngineArgs& a) {
  cmd->add_option("--model", a.model, "Model directory (Hugging Face layout)")->required();
  a.dp_option =
      cmd->add_option("--dp", a.dp, "DP groups (device processes); experts are spread over all")
          ->check(CLI::Range(1, 64));
  cmd->add_option("--attention-dp", a.attention_dp,
                  "MoE/attention disaggregation: attention DP groups (with --expert-devices; "
                  "not with --dp)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--expert-devices", a.expert_devices,
                  "MoE/attention disaggregation: device processes holding the routed experts, "
                  "reached over A2E/E2A (with --attention-dp)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--dp-domains", a.dp_domains,
                  "A/E: DP domains the attention groups are split into; one at a time "
                  "exchanges with the expert devices")
      ->check(CLI::Range(1, 16));
  cmd->add_option("--microbatches", a.microbatches,
                  "A/E: microbatches each attention group splits a MoE layer's tokens into")
      ->check(CLI::Range(1, 16));
  cmd->add_flag("--no-trampoline", a.no_trampoline,
                "A/E: each attention group sends its rows to every expert device itself "
                "instead of through its trampoline expert device (for comparison)");
  cmd->add_option("--ae-trace-dir", a.ae_trace_dir,
                  "A/E: directory where each expert device writes expert<k>.json when it stops "
                  "(busy fraction, controller round trips, a trace per domain, layer and "
                  "microbatch)");
  cmd->add_option("--max-num-seqs", a.max_num_seqs, "Running requests per DP group")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--max-num-batched-tokens", a.max_num_batched_tokens,
                  "Tokens per step per DP group (decodes + prefill chunks)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-memory", a.kv_memory, "KV cache memory per device (K/M/G suffixes)");
  cmd->add_option("--max-model-len", a.max_model_len,
                  "Longest prompt + output (0: the model's max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--compute-dtype", a.compute_dtype, kComputeDTypeHelp);
  cmd->add_option("--kv-cache-dtype", a.kv_cache_dtype, kKvCacheDTypeHelp);
  cmd->add_option("--activation-dtype", a.activation_dtype, kActivationDTypeHelp);
  cmd->add_option("--threads-per-device", a.threads_per_device,
                  "Worker threads per device process (0: cores / dp)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_flag("--no-prefix-cache", a.no_prefix_cache, "Do not reuse cached prompt blocks");
  cmd->add_option("--kv-reserve-ratio", a.kv_reserve_ratio,
                  "Share of a request's max_tokens counted as reserved KV when placing it "
                  "(below 1: more requests placed, preempted and recomputed if outputs run long)")
      ->check(finite_range(0.01, 1.0));
  cmd->add_flag("--no-chunked-prefill", a.no_chunked_prefill,
                "Prefill each prompt whole in one step (stalls the other streams)");
  add_speculative_flags(cmd, a.speculative);
  cmd->add_option("--redundant-slots", a.redundant_slots,
                  "EPLB: spare expert slots per device and MoE layer, reserved at start (needs "
                  "--dp > 1)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--eplb-window", a.eplb_window_s,
                  "EPLB: seconds per collect window (expert token counts sent to the shell)")
      ->check(finite_range(0.01, 86400.0));
  cmd->add_option("--eplb-slices", a.eplb_slices,
                  "EPLB: collect windows the shell keeps for the planner")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--eplb-interval", a.eplb_interval_s,
                  "EPLB: seconds between rebalances (0: only on POST /admin/eplb/rebalance)")
      ->check(finite_range(0.0, 1e7));
  cmd->add_option("--kv-transfer-timeout", a.kv_transfer_timeout_s,
                  "Prefill/decode disaggregation: seconds a prefill group holds a request's KV "
                  "for a decode group to pull before it frees it")
      ->check(finite_range(0.1, 86400.0));
  cmd->add_option("--kv-transfer-host", a.kv_transfer_host,
                  "Prefill/decode disaggregation between hosts: this instance's address for KV "
                  "transfers (a prefill instance's groups listen for UCX pulls there; a decode "
                  "instance compares it with the prefill side's to pick the backend)");
  cmd->add_option("--kv-transfer-backend", a.kv_transfer_backend,
                  "How decode groups pull KV: auto (shared memory on one host, UCX between "
                  "hosts), shm or ucx")
      ->check(CLI::IsMember({"auto", "shm", "ucx"}));
  cmd->add_option("--max-restarts", a.max_restarts,
                  "Times the instance may restart its processes (a process died or hung) "
                  "within --restart-window before it is declared failed")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--restart-window", a.restart_window_s,
                  "Seconds over which --max-restarts counts restarts")
      ->check(finite_range(1.0, 1e7));
  cmd->add_option("--group-heartbeat-interval", a.group_heartbeat_interval_ms,
                  "Milliseconds between the shell's heartbeats to each DP group (answered by "
                  "the group's own step loop)")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}));
  cmd->add_option("--group-timeout", a.group_timeout_s,
                  "Seconds a DP group that is up may leave the heartbeats unanswered before "
                  "it is declared hung (left out, or the instance restarts)")
      ->check(finite_range(0.1, 86400.0));
  cmd->add_flag("--no-scale-down", a.no_scale_down,
                "Restart the whole instance when a DP group dies or hangs, even where the other "
                "groups hold a copy of each of its experts (by default they go on without it)");
  cmd->add_flag("--expert-backup", a.expert_backup,
                "Once the DP groups are up, fill each group's redundant expert slots with copies "
                "of the next group's experts, so that a lost group can be left out (scale-down; "
                "every expert is covered with --redundant-slots >= experts / --dp)");
  cmd->add_flag("--fault-injection", a.fault_injection,
                "Accept POST /admin/faults (behind --api-key): kill, hang or disturb a DP "
                "group on request, for testing recovery");
}

void add_gateway_flags(CLI::App* cmd, GatewayArgs& a) {
  cmd->add_option("--host", a.host, "HTTP address to listen on");
  cmd->add_option("--port", a.port, "HTTP port")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a.api_key, "Require 'Authorization: Bearer KEY'");
  cmd->add_option("--served-model-name", a.served_model_name,
                  "Model name in the API (default: the model directory's name)");
  cmd->add_option("--chat-template", a.chat_template,
                  "Jinja chat template file overriding the model's");
  cmd->add_option("--generation-config", a.generation_config,
                  "auto: generation_config.json's temperature, top_p and top_k are the defaults "
                  "of requests that leave them out (as vLLM); none: the OpenAI defaults")
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_option("--reasoning-parser", a.reasoning_parser,
                  "Split <think>...</think> into reasoning_content: deepseek_r1 or qwen3");
  cmd->add_option("--tool-call-parser", a.tool_call_parser,
                  "Parse tool calls: deepseek_v3, qwen3 or kimi_k2");
  cmd->add_flag("--trust-request-special-tokens", a.trust_request_special_tokens,
                "Match special tokens in request text too (message content, tools, raw "
                "completion prompts); for trusted callers only: by default that text is "
                "tokenized as plain text, so a user cannot forge chat turns");
  cmd->add_option("--max-queue", a.max_queue, "Waiting requests before 503")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--long-prompt-tokens", a.long_prompt_tokens,
                  "Several instances: prompts of this many tokens or more are long, and the "
                  "gateway keeps them off instances prefilling short ones (and the reverse)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--instance-heartbeat-interval", a.instance_heartbeat_ms,
                  "Milliseconds between the gateway's heartbeats to each instance's shell")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}));
  cmd->add_option("--instance-timeout", a.instance_timeout_s,
                  "Seconds without an answer to the gateway's heartbeats (counted from the "
                  "instance's first answer) after which an instance is taken out: its requests "
                  "are recomputed elsewhere, or wait for it to come back")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  cmd->add_option("--recovery-timeout", a.recovery_timeout_s,
                  "Seconds the requests of a failed instance (and new ones, while no instance "
                  "serves) wait to be served again before they fail with 503")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  cmd->add_option("--shutdown-timeout", a.shutdown_timeout_s,
                  "On SIGTERM or SIGINT: seconds in-flight requests may take to finish (new "
                  "ones get 503) before the server stops and cuts what is left")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
}

Result<serve::InstanceOptions> instance_options(const EngineArgs& a, const std::string& listen) {
  serve::InstanceOptions o;
  o.listen = listen;
  o.dp = a.dp;
  if (a.attention_dp > 0 || a.expert_devices > 0) {
    if (a.dp_option != nullptr && a.dp_option->count() > 0)
      return invalid_argument("--dp cannot be given with --attention-dp/--expert-devices (the "
                              "attention groups are --attention-dp)");
    if (a.attention_dp < 1 || a.expert_devices < 1)
      return invalid_argument("--attention-dp {} and --expert-devices {}: MoE/attention "
                              "disaggregation needs both",
                              a.attention_dp, a.expert_devices);
    if (a.redundant_slots > 0)
      return invalid_argument("--redundant-slots with --attention-dp: EPLB does not run on "
                              "expert devices yet");
    if (a.speculative.tokens > 0)
      return unimplemented("--speculative-tokens with --attention-dp: the expert devices do "
                           "not serve MTP passes yet");
    engine::AeShape shape{a.attention_dp, a.expert_devices, a.dp_domains, a.microbatches};
    XDS_RETURN_IF_ERROR(engine::validate_ae_shape(shape));
    o.dp = a.attention_dp;
    o.ae_mode = true;
    o.group.ae = engine::ae_options(shape, a.max_num_batched_tokens);
    o.group.ae.trace_dir = a.ae_trace_dir;
    o.group.ae.trampoline = !a.no_trampoline;
  } else if (a.dp_domains != 1 || a.microbatches != 1 || !a.ae_trace_dir.empty() ||
             a.no_trampoline) {
    return invalid_argument("--dp-domains, --microbatches, --no-trampoline and --ae-trace-dir "
                            "need --attention-dp and --expert-devices");
  }
  o.threads_per_device = a.threads_per_device;
  o.placement.reserve_ratio = a.kv_reserve_ratio;
  engine::DpGroupOptions& g = o.group;
  g.core.model_dir = a.model;
  XDS_RETURN_IF_ERROR(parse_dtype_flags(a.compute_dtype, a.kv_cache_dtype, g.core.model));
  XDS_RETURN_IF_ERROR(parse_activation_flag(a.activation_dtype, g.core.model));
  g.core.max_num_seqs = a.max_num_seqs;
  g.core.max_num_batched_tokens = a.max_num_batched_tokens;
  g.core.chunked_prefill = !a.no_chunked_prefill;
  g.core.prefix_cache = !a.no_prefix_cache;
  XDS_ASSIGN_OR_RETURN(g.core.kv_memory_bytes, parse_size("--kv-memory", a.kv_memory));
  g.core.max_model_len = a.max_model_len;
  XDS_RETURN_IF_ERROR(check_speculative_flags(a.speculative, a.model));
  g.core.speculative_tokens = a.speculative.tokens;
  g.core.speculative_mtp_layers = a.speculative.mtp_layers;
  if (a.redundant_slots > 0 && a.dp < 2)
    return invalid_argument("--redundant-slots {} needs expert parallelism (--dp > 1, got {})",
                            a.redundant_slots, a.dp);
  if (a.expert_backup && a.redundant_slots < 1)
    return invalid_argument("--expert-backup copies experts into redundant slots: it needs "
                            "--redundant-slots > 0 (and --dp > 1)");
  g.redundant_slots = a.redundant_slots;
  g.eplb_window_ns = static_cast<int64_t>(a.eplb_window_s * 1e9);
  g.handoff.kv_transfer_timeout_ns = static_cast<int64_t>(a.kv_transfer_timeout_s * 1e9);
  g.handoff.kv_transfer_host = a.kv_transfer_host;
  g.handoff.kv_transfer_backend = a.kv_transfer_backend;
  if (a.cluster_secret) g.handoff.link_secret = a.cluster_secret->bytes;
  o.eplb.redundant_slots = a.redundant_slots;
  o.eplb.slices = a.eplb_slices;
  o.eplb.interval_s = a.eplb_interval_s;
  o.max_restarts = a.max_restarts;
  o.restart_window_s = static_cast<int64_t>(a.restart_window_s);
  o.group_heartbeat_interval_ms = a.group_heartbeat_interval_ms;
  o.group_timeout_ms = static_cast<int64_t>(a.group_timeout_s * 1000);
  o.fault_injection = a.fault_injection;
  o.scale_down = !a.no_scale_down;
  o.expert_backup = a.expert_backup;
  g.scale_down = o.scale_down;
  return o;
}

serve::GatewayOptions gateway_options(const GatewayArgs& a, const std::string& model,
                                      int64_t max_model_len,
                                      const std::vector<std::string>& instances) {
  serve::GatewayOptions o;
  o.host = a.host;
  o.port = a.port;
  o.api_key = a.api_key;
  o.served_model_name = a.served_model_name;
  o.model_dir = model;
  o.chat_template = a.chat_template;
  o.instances = instances;
  o.max_model_len = max_model_len;
  o.max_queue = a.max_queue;
  o.long_prompt_tokens = a.long_prompt_tokens;
  o.instance_heartbeat_ms = a.instance_heartbeat_ms;
  o.instance_timeout_s = a.instance_timeout_s;
  o.recovery_timeout_s = a.recovery_timeout_s;
  o.shutdown_timeout_s = a.shutdown_timeout_s;
  o.generation_config = a.generation_config;
  o.reasoning_parser = a.reasoning_parser;
  o.tool_call_parser = a.tool_call_parser;
  o.trust_request_special_tokens = a.trust_request_special_tokens;
  return o;
}

// An instance process that `serve` forked: polled by the gateway (it stops serving once the
// instance has exited for good: restarted too often, or killed as a whole), then waited for.
struct InstanceChild {
  pid_t pid = -1;
  bool reaped = false;
  int status = 0;

  // Non-empty once it exited: how.
  std::string exited() {
    if (!reaped && ::waitpid(pid, &status, WNOHANG) == pid) reaped = true;
    if (!reaped) return {};
    return WIFSIGNALED(status) ? fmt::format("the instance was killed by signal {}", WTERMSIG(status))
                               : fmt::format("the instance exited with code {}", WEXITSTATUS(status));
  }
  int wait() {
    if (!reaped) {
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      reaped = true;
    }
    return status;
  }
};

serve::Gateway* g_gateway = nullptr;
void on_gateway_signal(int) {
  if (g_gateway) g_gateway->stop();
}

// Runs the gateway as this process (`serve`'s parent after its children are forked, or
// `gateway`), named "xds-gateway" in ps and /proc/PID/comm (the threads made later inherit
// it).
Status run_gateway(const serve::GatewayOptions& o, bool shutdown_instance) {
  set_process_name(process_name("gateway"));
  XDS_ASSIGN_OR_RETURN(auto gateway, serve::Gateway::create(o));
  g_gateway = gateway.get();
  struct sigaction sa = {};
  sa.sa_handler = on_gateway_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  std::fprintf(stderr, "xdeepserve: serving on http://%s:%d/v1\n", o.host.c_str(), gateway->port());
  Status st = gateway->run(shutdown_instance, static_cast<int>(o.shutdown_timeout_s));
  g_gateway = nullptr;
  return st;
}

struct DisaggArgs {
  int prefill = 0, decode = 0;
  int prefill_dp = 0, decode_dp = 0;
};

// `serve --prefill-instances P --decode-instances D`: P + D instances as children (each dies
// with this process), on the ports after `first_port`, the cores shared out evenly, then the
// gateway in front of all of them.
Status serve_disaggregated(const EngineArgs& e, const GatewayArgs& g, const DisaggArgs& pd,
                           int first_port) {
  struct Child {
    serve::InstanceOptions options;
    pid_t pid = -1;
  };
  std::vector<Child> children;
  std::vector<std::string> addresses;
  const int devices = pd.prefill * (pd.prefill_dp > 0 ? pd.prefill_dp : e.dp) +
                      pd.decode * (pd.decode_dp > 0 ? pd.decode_dp : e.dp);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < pd.prefill + pd.decode; ++i) {
    const bool prefill = i < pd.prefill;
    EngineArgs a = e;
    a.dp = prefill ? (pd.prefill_dp > 0 ? pd.prefill_dp : e.dp)
                   : (pd.decode_dp > 0 ? pd.decode_dp : e.dp);
    if (a.threads_per_device == 0) a.threads_per_device = std::max(1, cores / devices);
    const std::string listen = fmt::format("tcp://127.0.0.1:{}", (first_port + i) % 65536);
    XDS_ASSIGN_OR_RETURN(serve::InstanceOptions io, instance_options(a, listen));
    XDS_RETURN_IF_ERROR(engine::ep_staging_bytes(io.group.core.model_dir, io.group.core.model,
                                                 io.group.core.max_num_batched_tokens, io.dp,
                                                 io.group.redundant_slots)
                            .status());
    io.role = prefill ? "prefill" : "decode";
    io.pin = false;   // the instances share the machine's cores
    io.instance = i;  // "xds-<i>-dp<r>" in ps
    addresses.push_back(listen);
    children.push_back(Child{std::move(io), -1});
  }
  const pid_t parent = ::getpid();
  for (Child& c : children) {
    c.pid = ::fork();
    if (c.pid < 0) return internal_error("fork failed: {}", errno);
    if (c.pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(111);
      const Status s = serve::run_instance(c.options);
      if (!s.ok()) std::fprintf(stderr, "error: instance: %s\n", s.to_string().c_str());
      ::_exit(s.ok() ? 0 : 1);
    }
  }
  std::vector<InstanceChild> watched;
  for (const Child& c : children) watched.push_back(InstanceChild{c.pid});
  serve::GatewayOptions go = gateway_options(g, e.model, e.max_model_len, addresses);
  go.fault_injection = e.fault_injection;
  go.instances_exited = [&watched] {
    // Each instance restarts its own processes; once every one has exited, nothing serves.
    std::string all;
    for (InstanceChild& w : watched) {
      const std::string how = w.exited();
      if (how.empty()) return std::string();
      all += (all.empty() ? "" : "; ") + how;
    }
    return all;
  };
  Status st = run_gateway(go, /*shutdown_instance=*/true);
  for (size_t k = 0; k < children.size(); ++k) {
    Child& c = children[k];
    const int status = watched[k].wait();
    if (st.ok() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      st = internal_error("the {} instance at {} ended with status {}", c.options.role,
                          c.options.listen, status);
  }
  return st;
}

void report(const Status& s, int* exit_code) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    *exit_code = 1;
  }
}

}  // namespace

// The internal channels' keys (protocol/channel_security.h): from --cluster-secret-file, or
// (serve, whose processes are all its children) a secret drawn for this run. Returns the
// secret, which the DP groups' UCX KV links prove too (xccl/ucx_link.h).
Result<protocol::ClusterSecret> init_channel_keys(const std::string& secret_file, bool required) {
  if (secret_file.empty()) {
    if (required) {
      return invalid_argument(
          "--cluster-secret-file is required: an instance and its gateways authenticate each "
          "other with it (one file of random bytes, mode 0600, the same on every host)");
    }
    const protocol::ClusterSecret drawn = protocol::random_cluster_secret();
    protocol::set_channel_keys(protocol::derive_curve_keys(drawn));
    return drawn;
  }
  XDS_ASSIGN_OR_RETURN(const protocol::ClusterSecret secret,
                       protocol::read_cluster_secret(secret_file));
  protocol::set_channel_keys(protocol::derive_curve_keys(secret));
  return secret;
}

constexpr const char* kClusterSecretHelp =
    "File (mode 0600) whose bytes key the CURVE authentication and encryption of the internal "
    "ZeroMQ channels and the proof UCX KV links exchange; the same file for an instance, its "
    "gateways and the instances it hands KV to or from";

void add_serve_commands(CLI::App& app, int* exit_code) {
  {
    auto e = std::make_shared<EngineArgs>();
    auto g = std::make_shared<GatewayArgs>();
    auto instance_port = std::make_shared<int>(0);
    auto pd = std::make_shared<DisaggArgs>();
    auto secret = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "serve", "OpenAI-compatible server: a gateway and one instance of --dp DP groups");
    add_engine_flags(cmd, *e);
    add_gateway_flags(cmd, *g);
    cmd->add_option("--cluster-secret-file", *secret,
                    std::string(kClusterSecretHelp) + " (default: a secret drawn for this run)");
    cmd->add_option("--instance-port", *instance_port,
                    "TCP port of the instance's shell (0: the HTTP port + 100; instances of a "
                    "disaggregated deployment take the ports after it)")
        ->check(CLI::Range(0, 65535));
    cmd->add_option("--prefill-instances", pd->prefill,
                    "Prefill/decode disaggregation: prefill instances (with --decode-instances)")
        ->check(CLI::Range(0, 16));
    cmd->add_option("--decode-instances", pd->decode, "Decode instances (with --prefill-instances)")
        ->check(CLI::Range(0, 16));
    cmd->add_option("--prefill-dp", pd->prefill_dp, "DP groups per prefill instance (0: --dp)")
        ->check(CLI::Range(0, 64));
    cmd->add_option("--decode-dp", pd->decode_dp, "DP groups per decode instance (0: --dp)")
        ->check(CLI::Range(0, 64));
    cmd->callback([e, g, instance_port, pd, secret, exit_code] {
      auto keys = init_channel_keys(*secret, /*required=*/false);
      if (!keys.ok()) return report(keys.status(), exit_code);
      e->cluster_secret = *keys;
      const int port = *instance_port > 0 ? *instance_port : (g->port + 100) % 65536;
      if ((pd->prefill > 0) != (pd->decode > 0)) {
        return report(invalid_argument("--prefill-instances {} and --decode-instances {}: "
                                       "disaggregation needs at least one of each",
                                       pd->prefill, pd->decode),
                      exit_code);
      }
      if (pd->prefill > 0) return report(serve_disaggregated(*e, *g, *pd, port), exit_code);
      const std::string listen = fmt::format("tcp://127.0.0.1:{}", port);
      auto io = instance_options(*e, listen);
      if (!io.ok()) return report(io.status(), exit_code);
      // What the instance refuses before it starts (a model that --dp cannot spread), refused
      // here: the gateway would otherwise serve with no instance behind it.
      if (auto staging =
              io->ae_mode
                  ? engine::ae_staging_bytes(io->group.core.model_dir, io->group.core.model,
                                             io->group.ae)
                  : engine::ep_staging_bytes(io->group.core.model_dir, io->group.core.model,
                                             io->group.core.max_num_batched_tokens, io->dp,
                                             io->group.redundant_slots);
          !staging.ok()) {
        return report(staging.status(), exit_code);
      }
      // The instance runs in a child that dies with this process.
      const pid_t parent = ::getpid();
      const pid_t child = ::fork();
      if (child < 0) return report(internal_error("fork failed: {}", errno), exit_code);
      if (child == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(111);
        const Status s = serve::run_instance(*io);
        if (!s.ok()) std::fprintf(stderr, "error: instance: %s\n", s.to_string().c_str());
        ::_exit(s.ok() ? 0 : 1);
      }
      InstanceChild watched{child};
      serve::GatewayOptions go = gateway_options(*g, e->model, e->max_model_len, {listen});
      go.fault_injection = e->fault_injection;
      go.instances_exited = [&watched] { return watched.exited(); };
      const Status s = run_gateway(go, /*shutdown_instance=*/true);
      const int status = watched.wait();
      report(s, exit_code);
      if (s.ok() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        report(internal_error("the instance ended with status {}", status), exit_code);
      }
    });
  }
  {
    auto e = std::make_shared<EngineArgs>();
    auto listen = std::make_shared<std::string>("tcp://127.0.0.1:8100");
    auto role = std::make_shared<std::string>("colocated");
    auto secret = std::make_shared<std::string>();
    auto health_port = std::make_shared<int>(0);
    CLI::App* cmd = app.add_subcommand(
        "instance", "A shell and --dp DP groups, reached by gateways at --listen");
    add_engine_flags(cmd, *e);
    cmd->add_option("--cluster-secret-file", *secret, kClusterSecretHelp)->required();
    cmd->add_option("--listen", *listen, "ZeroMQ address of the shell (tcp://HOST:PORT)");
    cmd->add_option("--role", *role,
                    "colocated, prefill (hands each request's KV to a decode instance after "
                    "its first token) or decode")
        ->check(CLI::IsMember({"colocated", "prefill", "decode"}));
    cmd->add_option("--health-port", *health_port,
                    "HTTP port of GET /health on the host of --listen: 200 once every DP group "
                    "is up, 503 before (a readiness probe; 0: none)")
        ->check(CLI::Range(0, 65535));
    auto etcd = std::make_shared<serve::EtcdRegistrationOptions>();
    auto advertise = std::make_shared<std::string>();
    cmd->add_option("--etcd", etcd->endpoint,
                    "Register in etcd at http://HOST:PORT (its v3 JSON API) for gateways started "
                    "with --etcd: an entry under a lease kept alive while every DP group answers "
                    "its heartbeat, revoked on a clean shutdown");
    cmd->add_option("--etcd-prefix", etcd->prefix,
                    "The etcd key prefix of the instances' entries (default "
                    "/xdeepserve/instances/)");
    cmd->add_option("--etcd-ttl", etcd->ttl_s,
                    "Seconds the etcd entry outlives the last keep-alive (a dead or unhealthy "
                    "instance leaves the gateways' routing within this; default 10)")
        ->check(CLI::Range(2, 3600));
    cmd->add_option("--advertise", *advertise,
                    "The address published in etcd for gateways (default: --listen; required "
                    "when --listen binds 0.0.0.0)");
    cmd->callback([e, listen, role, secret, health_port, etcd, advertise, exit_code] {
      auto keys = init_channel_keys(*secret, /*required=*/true);
      if (!keys.ok()) return report(keys.status(), exit_code);
      e->cluster_secret = *keys;
      auto io = instance_options(*e, *listen);
      if (!io.ok()) return report(io.status(), exit_code);
      io->role = *role;
      io->health_port = *health_port;
      io->etcd = *etcd;
      io->advertise = *advertise;
      report(serve::run_instance(*io), exit_code);
    });
  }
  {
    auto g = std::make_shared<GatewayArgs>();
    auto model = std::make_shared<std::string>();
    auto instances = std::make_shared<std::vector<std::string>>(
        std::vector<std::string>{"tcp://127.0.0.1:8100"});
    auto max_model_len = std::make_shared<int64_t>(0);
    auto secret = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand("gateway", "The HTTP front of instances started separately");
    cmd->add_option("--cluster-secret-file", *secret, kClusterSecretHelp)->required();
    cmd->add_option("--model", *model, "Model directory (tokenizer, chat template, config)")
        ->required();
    CLI::Option* fixed =
        cmd->add_option("--instance,--instances", *instances,
                        "ZeroMQ addresses of the instances' shells, comma-separated (each reports "
                        "its role: colocated, prefill or decode)")
            ->delimiter(',');
    auto etcd = std::make_shared<std::string>();
    auto etcd_prefix = std::make_shared<std::string>(serve::kDefaultEtcdPrefix);
    cmd->add_option("--etcd", *etcd,
                    "Learn the instances from etcd at http://HOST:PORT instead of --instances: "
                    "those registered under --etcd-prefix, added and dropped as they come and go "
                    "(each still authenticated by the cluster secret)")
        ->excludes(fixed);
    cmd->add_option("--etcd-prefix", *etcd_prefix,
                    "The etcd key prefix of the instances' entries (default "
                    "/xdeepserve/instances/)");
    cmd->add_option("--max-model-len", *max_model_len,
                    "Longest prompt + output (0: the model's max_position_embeddings)")
        ->check(CLI::NonNegativeNumber);
    add_gateway_flags(cmd, *g);
    auto output_host = std::make_shared<std::string>("127.0.0.1");
    cmd->add_option("--output-host", *output_host,
                    "Address the instances' output processes send this gateway's token "
                    "streams to (it listens there on a free port): on another host than the "
                    "instances, an address of this host they reach");
    auto faults = std::make_shared<bool>(false);
    cmd->add_flag("--fault-injection", *faults,
                  "Accept POST /admin/faults (behind --api-key) and pass each fault to the "
                  "instance it names (which must run with --fault-injection too)");
    cmd->callback([g, model, instances, max_model_len, secret, output_host, faults, etcd,
                   etcd_prefix, exit_code] {
      if (auto keys = init_channel_keys(*secret, /*required=*/true); !keys.ok()) {
        return report(keys.status(), exit_code);
      }
      serve::GatewayOptions go = gateway_options(
          *g, *model, *max_model_len, etcd->empty() ? *instances : std::vector<std::string>{});
      go.output_host = *output_host;
      go.etcd = *etcd;
      go.etcd_prefix = *etcd_prefix;
      go.fault_injection = *faults;
      report(run_gateway(go, /*shutdown_instance=*/false), exit_code);
    });
  }
}

}  // namespace xds::cli
