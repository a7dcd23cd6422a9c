// grow: a scratch vector at least `count` elements long, for buffers that are reused across
// calls and only ever grow (their contents are not kept meaningful between calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace xds {

// v.data() after resizing v to at least count elements (never shrinks; new elements
// value-initialised, old ones kept).
template <typename T>
T* grow(std::vector<T>& v, int64_t count) {
  if (v.size() < static_cast<size_t>(count)) v.resize(static_cast<size_t>(count));
  return v.data();
}

}  // namespace xds
