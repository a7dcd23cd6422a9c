#include "base/read_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace xds {

Result<std::string> read_whole_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return invalid_argument("{}: is a directory, not a file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("{}: cannot open the file: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return data_loss("{}: read error", path);
  return ss.str();
}

}  // namespace xds
