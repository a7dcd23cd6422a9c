// The micro-kernel instruction sets of this build, for tests that run their checks on each.
#pragma once

#include <vector>

#include "kernels/cpu/linear_panels.h"

namespace xds::kernels {

// AVX2 always, AVX-512 where the build targets it (panel_isa() selects the panel and the
// absorbed attention tiles).
inline std::vector<PanelIsa> available_isas() {
  std::vector<PanelIsa> isas;
  for (const PanelIsa isa : {PanelIsa::kAvx2, PanelIsa::kAvx512})
    if (panel_isa_available(isa)) isas.push_back(isa);
  return isas;
}

// Restores the default instruction set when a test ends.
struct IsaGuard {
  PanelIsa saved = panel_isa();
  ~IsaGuard() { set_panel_isa(saved); }
};

}  // namespace xds::kernels
