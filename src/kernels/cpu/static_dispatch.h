// Runtime count → compile-time template argument, for the kernels' tile sizes.
#pragma once

#include <utility>

namespace xds::kernels {

// Calls f.template operator()<N>() for the one N in [1, Max] equal to n; false (and no
// call) when n is outside that range.
template <int Max, class F>
bool dispatch_1_to(int n, F&& f) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    return ((n == I + 1 ? (f.template operator()<I + 1>(), true) : false) || ...);
  }
  (std::make_integer_sequence<int, Max>{});
}

}  // namespace xds::kernels
