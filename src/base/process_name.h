// The names the project's processes give themselves (/proc/PID/comm, what `ps` and `top`
// show): "xds-gateway", "xds-shell", "xds-dp<r>", "xds-out<r>". When one machine runs several
// instances (serve --prefill-instances P --decode-instances D), an instance's processes carry
// its index: "xds-<i>-shell", "xds-<i>-dp<r>", "xds-<i>-out<r>".
//
// Thread-safety: set_process_name renames the calling thread (the process's main thread when
// called first thing in a process); threads created afterwards inherit the name.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace xds {

// The kernel keeps 15 bytes of a task's name (TASK_COMM_LEN 16 with the terminator).
inline constexpr size_t kMaxProcessNameBytes = 15;

// "xds-" + ("<instance>-" when instance >= 0) + role + ("<rank>" when rank >= 0), cut to
// kMaxProcessNameBytes.
std::string process_name(std::string_view role, int instance = -1, int rank = -1);

// prctl(PR_SET_NAME): the calling thread's name, cut by the kernel to 15 bytes.
void set_process_name(const std::string& name);

}  // namespace xds
