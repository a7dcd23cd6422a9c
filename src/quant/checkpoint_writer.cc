#include "quant/checkpoint_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "model/safetensors.h"

namespace xds {
namespace {

using ojson = nlohmann::ordered_json;

Status write_shard(const std::string& path, const std::vector<const OutTensor*>& tensors) {
  std::vector<SafetensorsEntry> entries;
  for (const OutTensor* t : tensors)
    entries.push_back({t->name, t->dtype, t->shape, t->bytes.size()});
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  XDS_RETURN_IF_ERROR(f.write(safetensors_header(entries)));
  for (const OutTensor* t : tensors) XDS_RETURN_IF_ERROR(f.write(t->bytes.data(), t->bytes.size()));
  return f.commit();
}

}  // namespace

Status write_sharded_safetensors(const std::string& dir, const std::vector<OutTensor>& tensors,
                                 int64_t max_shard_bytes) {
  std::vector<std::vector<const OutTensor*>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const OutTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t nbytes = static_cast<int64_t>(t.bytes.size());
    if (numel * dtype_size(t.dtype) != nbytes) {
      return internal_error("tensor '{}': {} bytes for shape {} of {}", t.name, nbytes,
                            format_shape(t.shape), dtype_name(t.dtype));
    }
    if (!shards.back().empty() && in_shard + nbytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += nbytes;
    total += nbytes;
  }
  const size_t n = shards.size();
  ojson weight_map = ojson::object();
  for (size_t i = 0; i < n; ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    XDS_RETURN_IF_ERROR(write_shard(dir + "/" + file, shards[i]));
    for (const OutTensor* t : shards[i]) weight_map[t->name] = file;
  }
  const ojson index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  XDS_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(dir + "/model.safetensors.index.json"));
  XDS_RETURN_IF_ERROR(f.write(index.dump(2) + "\n"));
  return f.commit();
}

Status copy_checkpoint_side_files(const std::string& from, const std::string& to,
                                  std::initializer_list<std::string_view> also_skip) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(from, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json" ||
        std::find(also_skip.begin(), also_skip.end(), name) != also_skip.end()) {
      continue;
    }
    std::filesystem::copy_file(e.path(), to + "/" + name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return internal_error("{}: cannot copy to {}: {}", e.path().string(), to, ec.message());
  }
  if (ec) return internal_error("{}: cannot list: {}", from, ec.message());
  return {};
}

}  // namespace xds
