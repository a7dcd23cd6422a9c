#include "serve/instance.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/process_name.h"
#include "engine/expert_device.h"
#include "output/output_process.h"
#include "protocol/zmq_io.h"
#include "serve/instance_health.h"
#include "serve/process_watch.h"
#include "serve/restart_budget.h"
#include "serve/shell.h"
#include "xccl/launcher.h"

namespace xds::serve {
namespace {

Shell* g_shell = nullptr;
volatile sig_atomic_t g_incarnation_pid = 0;  // the supervisor's current child
volatile sig_atomic_t g_stopping = 0;

// How an incarnation process ends (its exit code, read by the supervisor).
constexpr int kExitClean = 0;    // shut down on request
constexpr int kExitFatal = 1;    // could not start (bad options, a port in use)
constexpr int kExitRestart = 75; // a process died or hung: start again

void on_stop_signal(int) {
  if (g_shell) g_shell->stop();
}

// The supervisor passes SIGTERM/SIGINT on to the incarnation, which drains.
void on_supervisor_signal(int sig) {
  g_stopping = 1;
  if (g_incarnation_pid > 0) ::kill(static_cast<pid_t>(g_incarnation_pid), sig);
}

// Forks one output process; it dies with this one.
Result<pid_t> spawn_output_process(const output::OutputProcessOptions& o) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return internal_error("fork of an output process failed: {}", errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(111);
    ::_exit(output::run_output_process(o));
  }
  return pid;
}

}  // namespace

// One start of the instance: its processes, then the shell until it stops or fails.
static Status run_incarnation(const InstanceOptions& options, uint32_t epoch, uint64_t incarnation,
                       bool will_restart) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A/E: the expert devices after the attention groups, in the same fabric.
  const int experts = options.ae_mode ? options.group.ae.shape.experts : 0;
  const int n_devices = options.dp + experts;
  const int threads =
      options.threads_per_device > 0 ? options.threads_per_device : std::max(1, cores / n_devices);

  std::vector<std::string> group_inputs, output_inputs;
  for (int g = 0; g < options.dp; ++g) {
    group_inputs.push_back(protocol::abstract_ipc_address(fmt::format("group{}", g)));
    output_inputs.push_back(protocol::abstract_ipc_address(fmt::format("output{}", g)));
  }
  const std::string shell_input = protocol::abstract_ipc_address("shell");

  // Output processes first (they need only the tokenizer).
  std::vector<pid_t> outputs;
  for (int g = 0; g < options.dp; ++g) {
    output::OutputProcessOptions o;
    o.model_dir = options.group.core.model_dir;
    o.listen_address = output_inputs[static_cast<size_t>(g)];
    o.group = g;
    o.instance = options.instance;
    o.cancel_address = shell_input;
    XDS_ASSIGN_OR_RETURN(pid_t pid, spawn_output_process(o));
    outputs.push_back(pid);
  }

  xccl::LaunchOptions lo;
  lo.devices = n_devices;
  lo.epoch = epoch;
  // A lost group can start again (not in A/E mode: no scale-down there).
  lo.keep_arenas = options.scale_down && options.dp > 1 && !options.ae_mode;
  if (options.ae_mode) {
    XDS_ASSIGN_OR_RETURN(lo.arena.staging_bytes,
                         engine::ae_staging_bytes(options.group.core.model_dir,
                                                  options.group.core.model, options.group.ae));
  } else {
    XDS_ASSIGN_OR_RETURN(
        lo.arena.staging_bytes,
        engine::ep_staging_bytes(options.group.core.model_dir, options.group.core.model,
                                 options.group.core.max_num_batched_tokens, options.dp,
                                 options.group.redundant_slots));
  }
  if (options.pin && threads * n_devices <= cores) {
    // Device g on cores [g x threads, (g + 1) x threads): its pool's threads share them.
    for (int g = 0; g < n_devices; ++g) lo.cpus.push_back(g * threads);
    lo.cpus_per_device = threads;
  }
  std::vector<engine::DpGroupOptions> per_group;
  for (int g = 0; g < options.dp; ++g) {
    engine::DpGroupOptions o = options.group;
    o.core.model.threads = threads;
    o.instance = options.instance;
    o.control_address = group_inputs[static_cast<size_t>(g)];
    o.shell_address = shell_input;
    o.output_address = output_inputs[static_cast<size_t>(g)];
    o.handoff.export_kv = options.role == "prefill";
    o.handoff.cooperative_prefill = options.role == "prefill" && options.dp > 1;
    o.scale_down = options.scale_down && options.role != "prefill" && !options.ae_mode;
    o.ae_mode = options.ae_mode;
    per_group.push_back(std::move(o));
  }
  engine::ExpertDeviceOptions expert_options;
  expert_options.model_dir = options.group.core.model_dir;
  expert_options.model = options.group.core.model;
  expert_options.model.threads = threads;
  expert_options.ae = options.group.ae;
  expert_options.instance = options.instance;
  XDS_ASSIGN_OR_RETURN(xccl::DeviceGroup devices,
                       xccl::DeviceGroup::spawn(lo, [&](xccl::Fabric& f) {
                         if (f.rank() >= options.dp)
                           return engine::run_expert_device(f, expert_options);
                         return engine::run_dp_group(f, per_group[static_cast<size_t>(f.rank())]);
                       }));

  ShellOptions so;
  so.listen = options.listen;
  so.role = options.role;
  so.cooperative = options.role == "prefill" && options.dp > 1;
  so.group_inputs = group_inputs;
  so.shell_input = shell_input;
  so.max_num_seqs = options.group.core.max_num_seqs;
  so.block_size = options.group.core.block_size;
  so.placement = options.placement;
  so.eplb = options.eplb;
  so.instance = options.instance;
  so.incarnation = incarnation;
  so.will_restart = will_restart;
  so.group_heartbeat_interval_ms = options.group_heartbeat_interval_ms;
  so.group_timeout_ms = options.group_timeout_ms;
  so.fault_injection = options.fault_injection;
  ProcessWatch watch;
  for (size_t g = 0; g < devices.pids().size(); ++g) {
    if (static_cast<int>(g) >= options.dp) {  // A/E: an expert device
      XDS_RETURN_IF_ERROR(watch.add(
          devices.pids()[g], fmt::format("expert device {}", static_cast<int>(g) - options.dp)));
      continue;
    }
    XDS_RETURN_IF_ERROR(
        watch.add(devices.pids()[g], fmt::format("DP group {}", g), static_cast<int32_t>(g)));
  }
  for (size_t g = 0; g < outputs.size(); ++g) {
    XDS_RETURN_IF_ERROR(watch.add(outputs[g], fmt::format("the output process of DP group {}", g)));
  }
  so.process_deaths = [&watch] { return watch.dead(); };
  so.scale_down = options.scale_down;
  so.expert_backup = options.expert_backup;
  so.kill_group = [&devices](int32_t g) {
    if (g >= 0 && static_cast<size_t>(g) < devices.pids().size()) {
      ::kill(devices.pids()[static_cast<size_t>(g)], SIGKILL);
    }
  };
  so.group_pids = [&devices, &options] {
    return std::vector<int32_t>(devices.pids().begin(), devices.pids().begin() + options.dp);
  };
  // A group left out starts again on its arenas and joins the others (rejoin).
  so.respawn_group = [&devices, &per_group, &watch](int32_t g) -> Result<int32_t> {
    per_group[static_cast<size_t>(g)].rejoining = true;
    XDS_ASSIGN_OR_RETURN(const pid_t pid, devices.respawn(g));
    XDS_RETURN_IF_ERROR(watch.replace(g, pid));
    return static_cast<int32_t>(pid);
  };
  // The readiness endpoint, after the last fork of the start (its threads must not be copied
  // into a child).
  std::atomic<bool> ready{false};
  std::unique_ptr<HttpServer> health;
  if (options.health_port > 0) {
    XDS_ASSIGN_OR_RETURN(const std::string host, listen_host(options.listen));
    XDS_ASSIGN_OR_RETURN(health,
                         start_instance_health(host, options.health_port, options.role, ready));
    so.ready = &ready;
  }
  std::unique_ptr<EtcdRegistration> registration;
  if (!options.etcd.endpoint.empty()) {
    etcd::InstanceRecord record;
    record.address = options.advertise.empty() ? options.listen : options.advertise;
    record.role = options.role;
    record.model = std::filesystem::path(options.group.core.model_dir).filename().string();
    if (record.model.empty()) {
      record.model =
          std::filesystem::path(options.group.core.model_dir).parent_path().filename().string();
    }
    XDS_ASSIGN_OR_RETURN(registration, EtcdRegistration::start(options.etcd, record));
    so.on_health = [&registration, record](const ShellHealth& h) mutable {
      record.groups = h.groups;
      record.running = h.running;
      record.waiting = h.waiting;
      record.kv_usage = h.kv_blocks_total > 0 ? static_cast<double>(h.kv_blocks_used) /
                                                    static_cast<double>(h.kv_blocks_total)
                                              : 0.0;
      registration->report(h.healthy, record);
    };
  }
  Shell shell(so);
  g_shell = &shell;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  XDS_LOG_INFO("instance: shell on {}, {} DP group(s){}, {} thread(s) each, epoch {}",
               options.listen, options.dp,
               options.ae_mode ? fmt::format(" in {} domain(s) with {} expert device(s), {} "
                                             "microbatch(es)",
                                             options.group.ae.shape.domains, experts,
                                             options.group.ae.shape.microbatches)
                               : std::string(),
               threads, epoch);
  Status st = shell.run();
  g_shell = nullptr;
  ready.store(false);
  if (health) health->stop(std::chrono::milliseconds(0));
  // A clean stop, or a failure with no restart to come, takes the entry out at once; an
  // incarnation that restarts only stops its keep-alives (the next one registers again, under
  // the same key, once its groups are up).
  if (registration) registration->stop(/*revoke=*/st.ok() || !will_restart);
  if (!st.ok()) {
    // A process died or hung (or the shell failed): the survivors may wait on it forever; the
    // device group's destructor kills and reaps them.
    XDS_LOG_ERROR("{}", st.message());
    for (pid_t pid : outputs) ::kill(pid, SIGKILL);
    for (pid_t pid : outputs) ::waitpid(pid, nullptr, 0);
    return st;
  }

  // The groups drain and exit after kShutdown; the output processes after theirs.
  auto exits = devices.wait();
  for (pid_t pid : outputs) ::kill(pid, SIGTERM);
  for (pid_t pid : outputs) ::waitpid(pid, nullptr, 0);
  XDS_RETURN_IF_ERROR(st);
  if (!exits.ok()) return exits.status();
  const std::vector<int32_t>& lost = shell.stats().lost_groups;
  for (size_t g = 0; g < exits->size(); ++g) {
    if (std::find(lost.begin(), lost.end(), static_cast<int32_t>(g)) != lost.end()) continue;
    if (!(*exits)[g].ok()) {
      return internal_error("{} {} ended with exit code {} signal {}",
                            static_cast<int>(g) < options.dp ? "DP group" : "expert device",
                            static_cast<int>(g) < options.dp ? g : g - size_t(options.dp),
                            (*exits)[g].exit_code, (*exits)[g].signal);
    }
  }
  return {};
}

Status run_instance(const InstanceOptions& options) {
  if (options.dp < 1 || options.dp > 64) {
    return invalid_argument("--dp must be in [1, 64], got {}", options.dp);
  }
  if (options.role != "colocated" && options.role != "prefill" && options.role != "decode") {
    return invalid_argument("--role must be colocated, prefill or decode, got '{}'", options.role);
  }
  if (!options.etcd.endpoint.empty()) {
    XDS_RETURN_IF_ERROR(
        check_etcd_flags(options.etcd.endpoint, options.etcd.prefix, options.etcd.ttl_s));
    const std::string& published = options.advertise.empty() ? options.listen : options.advertise;
    if (published.find("://0.0.0.0:") != std::string::npos ||
        published.find("://*:") != std::string::npos) {
      return invalid_argument(
          "--etcd: the address published for gateways, '{}', is a wildcard; "
          "give the reachable one with --advertise",
          published);
    }
  }
  if (options.ae_mode) {
    XDS_RETURN_IF_ERROR(engine::validate_ae_shape(options.group.ae.shape));
    if (options.group.ae.shape.attention != options.dp)
      return invalid_argument("A/E: {} DP groups but --attention-dp {}", options.dp,
                              options.group.ae.shape.attention);
    if (options.role == "prefill")
      return invalid_argument("--role prefill does not run in A/E mode (--attention-dp); "
                              "colocated and decode do");
    if (options.group.core.speculative_tokens > 0)
      return unimplemented("--speculative-tokens with --attention-dp: the expert devices do "
                           "not serve MTP passes yet");
  }
  if (options.max_restarts < 0) {
    return invalid_argument("--max-restarts must be at least 0, got {}", options.max_restarts);
  }
  if (options.health_port > 0) XDS_RETURN_IF_ERROR(listen_host(options.listen).status());
  set_process_name(process_name("inst", options.instance));
  struct sigaction sa = {};
  sa.sa_handler = on_supervisor_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  RestartBudget budget(options.max_restarts, options.restart_window_s * 1'000'000'000);
  std::mt19937_64 draw{std::random_device{}()};
  const pid_t supervisor = ::getpid();
  for (uint32_t epoch = 1;; ++epoch) {
    const uint64_t incarnation = draw() | 1;  // never 0 ("any incarnation")
    const bool will_restart = budget.allows(now_ns());
    const pid_t child = ::fork();
    if (child < 0) return internal_error("instance: fork failed: {}", errno);
    if (child == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != supervisor) ::_exit(kExitFatal);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGTERM, &dfl, nullptr);
      ::sigaction(SIGINT, &dfl, nullptr);
      const Status st = run_incarnation(options, epoch, incarnation, will_restart);
      if (st.ok()) ::_exit(kExitClean);
      if (st.code() == StatusCode::kAborted) ::_exit(kExitRestart);
      std::fprintf(stderr, "error: instance: %s\n", st.to_string().c_str());
      ::_exit(kExitFatal);
    }
    g_incarnation_pid = child;
    if (g_stopping) ::kill(child, SIGTERM);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    g_incarnation_pid = 0;
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == kExitClean;
    if (clean) return {};
    const std::string how =
        WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                            : fmt::format("exited with code {}", WEXITSTATUS(status));
    if (g_stopping) return unavailable("instance: stopping, and its processes {}", how);
    if (epoch == 1 && WIFEXITED(status) && WEXITSTATUS(status) == kExitFatal) {
      return unavailable("instance: could not start (its shell {})", how);
    }
    const int64_t now = now_ns();
    if (!budget.allows(now)) {
      return unavailable("instance: its processes failed again ({}) after {} restart(s) within {} s",
                         how, options.max_restarts, options.restart_window_s);
    }
    budget.restarted(now);
    XDS_LOG_WARN("instance: its processes failed (the shell {}); restart {} (epoch {})", how,
                 budget.total(), epoch + 1);
  }
}

}  // namespace xds::serve
