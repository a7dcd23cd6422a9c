#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/huge_page_buffer.h"
#include "base/json_depth.h"
#include "base/read_file.h"

namespace xds {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the safetensors format's own limit
constexpr size_t kProgressBytes = 1ull << 30;       // progress line above ~1 GB

std::string short_dump(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Parses one header entry into `t` (everything but `data`), checking it against the data
// area of `data_size` bytes. `begin` receives the start offset.
Status parse_entry(const std::string& path, const std::string& name, const json& e,
                   uint64_t data_size, TensorView& t, uint64_t& begin) {
  if (!e.is_object()) {
    return data_loss("{}: tensor '{}': bad header: expected an object, found {}", path, name,
                     short_dump(e));
  }
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) {
    return data_loss("{}: tensor '{}': bad header: expected a string 'dtype', found {}", path, name,
                     dt == e.end() ? "none" : short_dump(*dt));
  }
  std::optional<DType> dtype = dtype_from_name(dt->get<std::string>());
  if (!dtype) {
    return unimplemented(
        "{}: tensor '{}': unknown dtype \"{}\" (expected one of F32, BF16, F16, F8_E4M3, I8, "
        "U8, I16, I32, I64, BOOL, F64)",
        path, name, dt->get<std::string>());
  }
  t.dtype = *dtype;
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) {
    return data_loss("{}: tensor '{}': bad header: expected a 'shape' list, found {}", path, name,
                     sh == e.end() ? "none" : short_dump(*sh));
  }
  t.shape.clear();
  // numel with overflow checks: any product beyond the data area is an error anyway.
  uint64_t numel = 1;
  bool too_big = false;
  for (const json& d : *sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return data_loss(
          "{}: tensor '{}': bad header: expected non-negative integer dims, found "
          "shape {}",
          path, name, short_dump(*sh));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > (1ull << 48)) too_big = true;
    t.shape.push_back(static_cast<int64_t>(v));
    if (!too_big && v != 0 && numel > (1ull << 62) / v) too_big = true;
    if (!too_big) numel *= v;
  }
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return data_loss(
        "{}: tensor '{}': bad header: expected 'data_offsets' [begin, end] of "
        "non-negative integers, found {}",
        path, name, off == e.end() ? "none" : short_dump(*off));
  }
  begin = (*off)[0].get<uint64_t>();
  const uint64_t end = (*off)[1].get<uint64_t>();
  if (end < begin) {
    return data_loss("{}: tensor '{}': bad header: data_offsets [{}, {}] end before begin", path,
                     name, begin, end);
  }
  if (end > data_size) {
    return data_loss(
        "{}: tensor '{}': truncated file: data_offsets [{}, {}] end beyond the {} bytes of data "
        "in the file",
        path, name, begin, end, data_size);
  }
  const uint64_t expect = too_big ? UINT64_MAX : numel * dtype_size(t.dtype);
  if (end - begin != expect) {
    return data_loss(
        "{}: tensor '{}': shape {} of {} needs {} bytes, data_offsets [{}, {}] hold "
        "{}",
        path, name, format_shape(t.shape), dtype_name(t.dtype),
        too_big ? std::string("more than 2^62") : std::to_string(expect), begin, end, end - begin);
  }
  t.nbytes = end - begin;
  return {};
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  return format_shape(shape);
}

std::string format_shape(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string safetensors_header(std::span<const SafetensorsEntry> entries) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const SafetensorsEntry& e : entries) {
    header[std::string(e.name)] = {{"dtype", std::string(dtype_name(e.dtype))},
                                   {"shape", e.shape},
                                   {"data_offsets", {off, off + e.bytes}}};
    off += e.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>(text.size() >> (8 * i));
  return out + text;
}

// ---- MappedFile ----

Result<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return internal_error("{}: fstat failed: {}", path, std::strerror(err));
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<size_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return internal_error("{}: mmap of {} bytes failed: {}", path, m.size_, std::strerror(err));
    }
    // 2 MB page-cache folios and mappings where the kernel gives them (advise_huge_pages):
    // before the first touch, so that the faults read whole 2 MB folios.
    advise_huge_pages(p, m.size_);
    m.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

// ---- SafetensorsFile ----

Result<SafetensorsHeader> parse_safetensors_header(const std::byte* bytes, size_t size,
                                                   const std::string& path) {
  if (size < 8) {
    return data_loss("{}: truncated file: {} bytes, expected at least 8 for the header length",
                     path, size);
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  if (n > size - 8) {
    return data_loss(
        "{}: bad header: header length {} goes beyond the end of the file "
        "({} bytes after the length field)",
        path, n, size - 8);
  }
  if (n > kMaxHeaderBytes) {
    return data_loss("{}: bad header: header length {} exceeds the format's limit of {}", path, n,
                     kMaxHeaderBytes);
  }
  const char* hdr = reinterpret_cast<const char*>(bytes + 8);
  // Real headers nest 3 levels; deeper ones would exhaust the stack of the error messages'
  // dump() (base/json_depth.h).
  if (json_nesting_exceeds(std::string_view(hdr, n), kMaxJsonDepth)) {
    return data_loss("{}: bad header: JSON nested deeper than {} levels", path, kMaxJsonDepth);
  }
  json j = json::parse(hdr, hdr + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return data_loss("{}: bad header: the {}-byte header is not valid JSON", path, n);
  }
  if (!j.is_object()) {
    return data_loss("{}: bad header: expected a JSON object, found {}", path, short_dump(j));
  }
  const uint64_t data_size = size - 8 - n;
  const std::byte* data = bytes + 8 + n;

  SafetensorsHeader h;
  std::vector<std::pair<uint64_t, TensorView>> entries;
  entries.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) {
        return data_loss("{}: bad header: '__metadata__' must be an object of strings, found {}",
                         path, short_dump(*it));
      }
      for (auto mt = it->begin(); mt != it->end(); ++mt) {
        if (!mt->is_string()) {
          return data_loss("{}: bad header: '__metadata__' value '{}' must be a string, found {}",
                           path, mt.key(), short_dump(*mt));
        }
        h.metadata[mt.key()] = mt->get<std::string>();
      }
      continue;
    }
    TensorView t;
    t.name = it.key();
    t.file = path;
    uint64_t begin = 0;
    XDS_RETURN_IF_ERROR(parse_entry(path, t.name, *it, data_size, t, begin));
    t.data = data + begin;
    entries.emplace_back(begin, std::move(t));
  }
  // Tensors must tile the data area: sorted by offset, each starts where the last ended.
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second.nbytes < b.second.nbytes;
  });
  uint64_t pos = 0;
  const TensorView* prev = nullptr;
  for (const auto& [begin, t] : entries) {
    if (begin < pos) {
      return data_loss(
          "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (which ends "
          "at {})",
          path, t.name, begin, begin + t.nbytes, prev->name, pos);
    }
    if (begin > pos) {
      return data_loss(
          "{}: tensor '{}': data_offsets begin at {}, expected {} (tensors must be "
          "contiguous; {} unused bytes before it)",
          path, t.name, begin, pos, begin - pos);
    }
    pos = begin + t.nbytes;
    prev = &t;
  }
  if (pos != data_size) {
    return data_loss("{}: bad header: the tensors cover {} bytes of data but the file holds {}",
                     path, pos, data_size);
  }
  h.tensors.reserve(entries.size());
  for (auto& e : entries) h.tensors.push_back(std::move(e.second));
  return h;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  XDS_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(path));
  XDS_ASSIGN_OR_RETURN(SafetensorsHeader h, parse_safetensors_header(m.data(), m.size(), path));
  SafetensorsFile f;
  f.metadata_ = std::move(h.metadata);
  f.tensors_ = std::make_unique<std::vector<TensorView>>(std::move(h.tensors));
  for (size_t i = 0; i < f.tensors_->size(); ++i) f.index_.emplace((*f.tensors_)[i].name, i);
  f.map_ = std::make_unique<MappedFile>(std::move(m));
  return f;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &(*tensors_)[it->second];
}

// ---- Checkpoint ----

namespace {

Result<std::map<std::string, std::string>> read_weight_map(const std::string& index_path) {
  XDS_ASSIGN_OR_RETURN(const std::string text, read_whole_file(index_path));
  return parse_safetensors_index(text, index_path);
}

}  // namespace

Result<std::map<std::string, std::string>> parse_safetensors_index(std::string_view text,
                                                                   const std::string& index_path) {
  if (json_nesting_exceeds(text, kMaxJsonDepth)) {
    return invalid_argument("{}: JSON nested deeper than {} levels", index_path, kMaxJsonDepth);
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("{}: not valid JSON", index_path);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return invalid_argument(
        "{}: field 'weight_map': expected an object {{tensor: file}}, "
        "found {}",
        index_path,
        j.is_object() && j.contains("weight_map") ? short_dump(j["weight_map"])
                                                  : std::string("none"));
  }
  std::map<std::string, std::string> wm;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    const std::string& shard = it->is_string() ? it->get_ref<const std::string&>() : "";
    if (shard.empty() || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos || shard == "." || shard == "..") {
      return invalid_argument(
          "{}: weight_map['{}']: expected a file name in the directory, "
          "found {}",
          index_path, it.key(), short_dump(*it));
    }
    wm[it.key()] = shard;
  }
  return wm;
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> shard_paths;
  std::map<std::string, std::string> weight_map;
  const bool sharded = file_exists(index_path);
  if (sharded) {
    XDS_ASSIGN_OR_RETURN(weight_map, read_weight_map(index_path));
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : weight_map) {
      if (!seen.insert(shard).second) continue;
      const std::string p = fmt::format("{}/{}", dir, shard);
      if (!file_exists(p)) {
        return not_found("{}: shard '{}' (holding tensor '{}') is missing: {} does not exist",
                         index_path, shard, tensor, p);
      }
      shard_paths.push_back(p);
    }
  } else if (file_exists(single)) {
    shard_paths.push_back(single);
  } else {
    return not_found(
        "{}: no checkpoint: expected model.safetensors or "
        "model.safetensors.index.json",
        dir);
  }

  size_t total = 0;
  for (const auto& p : shard_paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) total += static_cast<size_t>(st.st_size);
  }
  const bool progress = total > kProgressBytes;
  size_t done = 0;
  std::unordered_map<std::string, const SafetensorsFile*> by_path;
  for (size_t i = 0; i < shard_paths.size(); ++i) {
    XDS_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(shard_paths[i]));
    auto owned = std::make_unique<SafetensorsFile>(std::move(f));
    done += owned->file_size();
    if (progress) {
      std::fprintf(stderr, "\ropening %s: %zu/%zu files, %.1f/%.1f GB", dir.c_str(), i + 1,
                   shard_paths.size(), done / 1e9, total / 1e9);
      std::fflush(stderr);
    }
    by_path[shard_paths[i]] = owned.get();
    c.files_.push_back(std::move(owned));
  }
  if (progress) std::fprintf(stderr, "\n");
  c.total_bytes_ = total;

  if (sharded) {
    for (const auto& [tensor, shard] : weight_map) {
      const std::string p = fmt::format("{}/{}", dir, shard);
      const TensorView* t = by_path.at(p)->find(tensor);
      if (t == nullptr) {
        return not_found("{}: tensor '{}' is listed in {} but missing from the shard", p, tensor,
                         index_path);
      }
      c.by_name_[tensor] = t;
    }
  } else {
    for (const TensorView& t : c.files_[0]->tensors()) c.by_name_[t.name] = &t;
  }
  return c;
}

const TensorView* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : it->second;
}

Result<const TensorView*> Checkpoint::require(std::string_view name,
                                              std::initializer_list<int64_t> shape) const {
  return require(name, std::span<const int64_t>(shape.begin(), shape.size()));
}

Result<const TensorView*> Checkpoint::require(std::string_view name,
                                              std::span<const int64_t> shape) const {
  const TensorView* t = find(name);
  if (t == nullptr) {
    return not_found("{}: missing tensor '{}' (expected shape {})", dir_, name,
                     format_shape(shape));
  }
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    return invalid_argument("{}: tensor '{}': wrong shape: expected {}, found {} ({})", t->file,
                            name, format_shape(shape), t->shape_string(), dtype_name(t->dtype));
  }
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [n, t] : by_name_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace xds
