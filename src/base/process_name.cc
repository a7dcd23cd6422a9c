#include "base/process_name.h"

#include <sys/prctl.h>

#include <fmt/format.h>

namespace xds {

std::string process_name(std::string_view role, int instance, int rank) {
  std::string name = "xds-";
  if (instance >= 0) name += fmt::format("{}-", instance);
  name += role;
  if (rank >= 0) name += fmt::format("{}", rank);
  if (name.size() > kMaxProcessNameBytes) name.resize(kMaxProcessNameBytes);
  return name;
}

void set_process_name(const std::string& name) { ::prctl(PR_SET_NAME, name.c_str(), 0, 0, 0); }

}  // namespace xds
