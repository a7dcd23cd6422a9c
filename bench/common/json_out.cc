#include "json_out.h"

#include <cstdio>

#include "base/atomic_file.h"

namespace xds::bench {

bool write_json(const std::string& path, const nlohmann::json& j) {
  Result<AtomicFile> file = AtomicFile::create(path);
  Status st = file.ok() ? file->write(j.dump(2) + "\n") : file.status();
  if (st.ok()) st = file->commit();
  if (!st.ok()) {
    std::fprintf(stderr, "error: could not write %s: %s\n", path.c_str(), st.to_string().c_str());
    return false;
  }
  std::printf("wrote %s\n", path.c_str());
  return true;
}

}  // namespace xds::bench
