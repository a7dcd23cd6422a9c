#include "serve/instance.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/log.h"
#include "output/output_process.h"
#include "protocol/zmq_io.h"
#include "serve/process_watch.h"
#include "serve/shell.h"
#include "xccl/launcher.h"

namespace xds::serve {
namespace {

Shell* g_shell = nullptr;

void on_stop_signal(int) {
  if (g_shell) g_shell->stop();
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

Status run_instance(const InstanceOptions& options) {
  if (options.dp < 1 || options.dp > 64) {
    return invalid_argument("--dp must be in [1, 64], got {}", options.dp);
  }
  if (options.role != "colocated" && options.role != "prefill" && options.role != "decode") {
    return invalid_argument("--role must be colocated, prefill or decode, got '{}'", options.role);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads =
      options.threads_per_device > 0 ? options.threads_per_device : std::max(1, cores / options.dp);

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
  lo.devices = options.dp;
  XDS_ASSIGN_OR_RETURN(
      lo.arena.staging_bytes,
      engine::ep_staging_bytes(options.group.core.model_dir, options.group.core.model,
                               options.group.core.max_num_batched_tokens, options.dp,
                               options.group.redundant_slots));
  if (options.pin && threads * options.dp <= cores) {
    // Device g on cores [g x threads, (g + 1) x threads): its pool's threads share them.
    for (int g = 0; g < options.dp; ++g) lo.cpus.push_back(g * threads);
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
    per_group.push_back(std::move(o));
  }
  XDS_ASSIGN_OR_RETURN(xccl::DeviceGroup devices,
                       xccl::DeviceGroup::spawn(lo, [&](xccl::Fabric& f) {
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
  ProcessWatch watch;
  for (size_t g = 0; g < devices.pids().size(); ++g) {
    XDS_RETURN_IF_ERROR(watch.add(devices.pids()[g], fmt::format("DP group {}", g)));
  }
  for (size_t g = 0; g < outputs.size(); ++g) {
    XDS_RETURN_IF_ERROR(watch.add(outputs[g], fmt::format("the output process of DP group {}", g)));
  }
  so.process_failure = [&watch] { return watch.deaths(); };
  Shell shell(so);
  g_shell = &shell;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  XDS_LOG_INFO("instance: shell on {}, {} DP group(s), {} thread(s) each", options.listen,
               options.dp, threads);
  Status st = shell.run();
  g_shell = nullptr;
  if (!st.ok()) {
    // A process died (or the shell failed): the survivors may wait on it forever; the device
    // group's destructor kills and reaps them.
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
  for (size_t g = 0; g < exits->size(); ++g) {
    if (!(*exits)[g].ok()) {
      return internal_error("DP group {} ended with exit code {} signal {}", g,
                            (*exits)[g].exit_code, (*exits)[g].signal);
    }
  }
  return {};
}

}  // namespace xds::serve
