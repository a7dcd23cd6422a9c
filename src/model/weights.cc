#include "model/weights.h"

#include "base/env.h"
#include "base/hash.h"
#include "base/huge_page_buffer.h"
#include "base/log.h"
#include "kernels/cpu/linear_panels.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>

namespace xds {
namespace {

constexpr size_t kProgressBytes = 1ull << 30;

// Repack file layout (little endian, all offsets in bytes):
//   [0, 8)    magic "XDSRPK01"
//   [8, 16)   u64 payload bytes P
//   [16, 24)  u64 key length K
//   [24, 32)  u64 payload offset D = align_up(32 + K, 64)
//   [32, 32+K) the cache key (verified on reuse, so a hash collision cannot alias)
//   [D, D+P)  payload (row-major F32 for matrices); file size == D + P
constexpr char kMagic[8] = {'X', 'D', 'S', 'R', 'P', 'K', '0', '1'};
constexpr size_t kFixedHeader = 32;

size_t payload_offset(size_t key_len) {
  return (kFixedHeader + key_len + 63) / 64 * 64;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "abs path|size|mtime" of a tensor's file, for cache keys.
std::string file_identity(const std::string& path) {
  std::error_code ec;
  std::string abs = std::filesystem::weakly_canonical(path, ec).string();
  if (ec) abs = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return abs + "|?";
  return fmt::format("{}|{}|{}.{:09d}", abs, static_cast<int64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec),
                     static_cast<int64_t>(st.st_mtim.tv_nsec));
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Runs fn(begin, end) over [0, n), on the pool if there is one.
void for_range(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr || n <= 1) {
    fn(0, n);
    return;
  }
  pool->parallel_for(n, [&](int64_t b, int64_t e, int) { fn(b, e); });
}

}  // namespace

bool panels_from_env() {
  return env::weight_layout() != "rows";
}

std::string repack_cache_dir_from_env() {
  if (std::optional<std::string> d = env::cache_dir()) return *d;
  if (std::optional<std::string> h = env::home()) return *h + "/.cache/xdeepserve/repack";
  return "/tmp/xdeepserve-repack";
}

// ---- RepackCache ----

RepackCache::RepackCache(RepackOptions opts) : opts_(std::move(opts)) {
  dir_ = opts_.dir.empty() ? repack_cache_dir_from_env() : opts_.dir;
}

RepackCache::~RepackCache() {
  finish_progress();
  for (const RepackBundle::Range& r : bundle_ranges_) {
    if (r.bytes > 0) ::munmap(r.base, r.bytes);
  }
}

Status RepackCache::bind_bundle(std::string_view name, const std::function<Status()>& bind) {
  if (in_bundle_) {
    return internal_error("repack cache: bundle '{}' opened inside bundle '{}'", name,
                          bundle_name_);
  }
  in_bundle_ = true;
  bundle_name_ = name;
  const Status bound = bind();
  in_bundle_ = false;
  std::unique_ptr<RepackBundle> bundle = std::move(bundle_);
  XDS_RETURN_IF_ERROR(bound);
  if (bundle == nullptr) return {};  // nothing inside went through the cache
  const size_t writes = bundle->bytes_to_write();
  if (writes > 0) XDS_RETURN_IF_ERROR(make_room(writes));
  XDS_ASSIGN_OR_RETURN(RepackBundle::Range range, bundle->finish());
  bundle_ranges_.push_back(range);
  if (writes > 0) note_written(bundle->path(), writes);
  return {};
}

Result<const std::byte*> RepackCache::get_or_create_in_bundle(
    const std::string& key, size_t nbytes, const std::function<Status(std::byte*)>& fill) {
  if (bundle_ == nullptr) {
    XDS_RETURN_IF_ERROR(prepare_to_write());
    XDS_ASSIGN_OR_RETURN(bundle_,
                         RepackBundle::open(fmt::format("{}/{:016x}.xrb", dir_,
                                                        fnv1a64("bundle|" + bundle_name_ + "|" +
                                                                key))));
    note_in_use(bundle_->path());
  }
  bool reused = false;
  XDS_ASSIGN_OR_RETURN(const std::byte* p, bundle_->get_or_create(key, nbytes, fill, &reused));
  ++(reused ? stats_.files_reused : stats_.files_written);
  return p;
}

std::string RepackCache::path_for_key(const std::string& key) const {
  return fmt::format("{}/{:016x}.xrp", dir_, fnv1a64(key));
}

const std::byte* RepackCache::map_existing(const std::string& path, const std::string& key,
                                           size_t nbytes) {
  Result<MappedFile> m = MappedFile::open(path);
  if (!m.ok()) return nullptr;
  const std::byte* p = m->data();
  const size_t off = payload_offset(key.size());
  if (m->size() != off + nbytes || std::memcmp(p, kMagic, 8) != 0) return nullptr;
  uint64_t hdr[3];
  std::memcpy(hdr, p + 8, sizeof(hdr));
  if (hdr[0] != nbytes || hdr[1] != key.size() || hdr[2] != off) return nullptr;
  if (std::memcmp(p + kFixedHeader, key.data(), key.size()) != 0) return nullptr;
  maps_.push_back(std::make_unique<MappedFile>(std::move(m).value()));
  return maps_.back()->data() + off;
}

Result<const std::byte*> RepackCache::get_or_create(const std::string& key, size_t nbytes,
                                                    const std::function<Status(std::byte*)>& fill) {
  if (in_bundle_) return get_or_create_in_bundle(key, nbytes, fill);
  const std::string path = path_for_key(key);
  if (const std::byte* p = map_existing(path, key, nbytes)) {
    ++stats_.files_reused;
    note_in_use(path);
    return p;
  }
  XDS_RETURN_IF_ERROR(prepare_to_write());
  XDS_RETURN_IF_ERROR(make_room(payload_offset(key.size()) + nbytes));
  // The writer's pid in the name lets a later loader tell a dead writer's leftover from a
  // file another live process is still filling.
  std::string tmp = fmt::format("{}.tmp.{}.XXXXXX", path, ::getpid());
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return internal_error("repack cache {}: cannot create a temporary file: {}", dir_,
                          std::strerror(errno));
  }
  const size_t off = payload_offset(key.size());
  const size_t total = off + nbytes;
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  // Reserve the blocks now: a full disk is an error here, not a SIGBUS while filling.
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    return fail(resource_exhausted("repack cache {}: cannot reserve {} bytes for {}: {}", dir_,
                                   total, key, std::strerror(err)));
  }
  void* w = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (w == MAP_FAILED) {
    return fail(internal_error("repack cache {}: mmap of {} bytes failed: {}", tmp, total,
                               std::strerror(errno)));
  }
  // Filled through 2 MB folios where the kernel gives them: the file's pages then stay in
  // the page cache as 2 MB folios, mapped as such by every later reader (MappedFile::open).
  advise_huge_pages(w, total);
  auto* b = static_cast<std::byte*>(w);
  std::memcpy(b, kMagic, 8);
  const uint64_t hdr[3] = {nbytes, key.size(), off};
  std::memcpy(b + 8, hdr, sizeof(hdr));
  std::memcpy(b + kFixedHeader, key.data(), key.size());
  Status st = fill(b + off);
  ::munmap(w, total);
  if (!st.ok()) return fail(st);
  ::fchmod(fd, 0644);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return internal_error("repack cache: rename {} -> {} failed: {}", tmp, path,
                          std::strerror(err));
  }
  const std::byte* p = map_existing(path, key, nbytes);
  if (p == nullptr) {
    return internal_error("repack cache: {} is not readable right after writing it", path);
  }
  ++stats_.files_written;
  note_written(path, total);
  return p;
}

namespace {

// The cache folder's repack files (single and bundles), with sizes and mtimes.
std::vector<RepackFile> list_repack_files(const std::string& dir) {
  std::vector<RepackFile> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".xrp") && !name.ends_with(".xrb")) continue;
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0) continue;
    out.push_back({name, static_cast<uint64_t>(st.st_size),
                   int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec});
  }
  return out;
}

std::string file_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

}  // namespace

void RepackCache::note_in_use(const std::string& path) {
  in_use_.insert(file_name(path));
  (void)::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // last use: now
}

void RepackCache::note_written(const std::string& path, uint64_t bytes) {
  const std::string name = file_name(path);
  in_use_.insert(name);
  if (!listing_) return;
  std::erase_if(*listing_, [&](const RepackFile& f) { return f.name == name; });
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  listing_->push_back({name, bytes, now});
}

Status RepackCache::make_room(uint64_t bytes) {
  RepackLimits limits;
  if (std::optional<std::string> gb = env::cache_max_gb()) {
    char* end = nullptr;
    const double v = std::strtod(gb->c_str(), &end);
    if (end == gb->c_str() || *end != '\0' || !std::isfinite(v) || v <= 0) {
      return invalid_argument("XDS_CACHE_MAX_GB='{}' is not a positive number of GB", *gb);
    }
    limits.folder_limit = static_cast<uint64_t>(v * double(uint64_t{1} << 30));
  }
  struct statvfs fs {};
  if (::statvfs(dir_.c_str(), &fs) == 0) {
    limits.disk_free = uint64_t{fs.f_bavail} * fs.f_frsize;
    limits.keep_free = uint64_t{fs.f_blocks} * fs.f_frsize / 20;
  }
  if (!listing_) listing_ = list_repack_files(dir_);
  const std::vector<std::string> victims =
      choose_repack_evictions(*listing_, bytes, limits, in_use_);
  if (victims.empty()) return {};
  uint64_t freed = 0;
  const std::unordered_set<std::string> removed(victims.begin(), victims.end());
  for (const RepackFile& f : *listing_) {
    if (!removed.contains(f.name)) continue;
    if (::unlink((dir_ + "/" + f.name).c_str()) == 0) freed += f.bytes;
  }
  std::erase_if(*listing_, [&](const RepackFile& f) { return removed.contains(f.name); });
  XDS_LOG_INFO("repack cache {}: removed {} least recently used files ({:.2f} GB) to make room "
               "for {:.3f} GB",
               dir_, victims.size(), double(freed) / double(1 << 30),
               double(bytes) / double(1 << 30));
  return {};
}

Status RepackCache::prepare_to_write() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    return internal_error("repack cache {}: cannot create the directory: {}", dir_, ec.message());
  if (!swept_) remove_stale_temporaries();
  return {};
}

void RepackCache::remove_stale_temporaries() {
  swept_ = true;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    size_t at = name.find(".xrp.tmp.");
    if (at == std::string::npos) at = name.find(".xrb.tmp.");  // a bundle (repack_bundle.h)
    if (at == std::string::npos) continue;
    const char* pid_text = name.c_str() + at + 9;
    char* end = nullptr;
    const long pid = std::strtol(pid_text, &end, 10);
    if (end == pid_text || *end != '.' || pid <= 0) continue;  // not ours (or an old name)
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // writer alive
    std::filesystem::remove(entry.path(), ec);
  }
}

std::span<const float> RepackCache::keep(std::vector<float> v) {
  vectors_.push_back(std::move(v));
  return {vectors_.back().data(), vectors_.back().size()};
}

void RepackCache::note_bound(const Checkpoint& ckpt, size_t nbytes) {
  bound_bytes_ += nbytes;
  if (!opts_.progress || ckpt.total_bytes() <= kProgressBytes) return;
  const double t = now_s();
  if (line_open_ && t - last_print_s_ < 0.25) return;
  last_print_s_ = t;
  line_open_ = true;
  std::fprintf(stderr, "\rbinding %s: %.2f/%.2f GB (%lld repacked, %lld reused)",
               ckpt.dir().c_str(), bound_bytes_ / 1e9, ckpt.total_bytes() / 1e9,
               static_cast<long long>(stats_.files_written),
               static_cast<long long>(stats_.files_reused));
  std::fflush(stderr);
}

void RepackCache::finish_progress() {
  if (!line_open_) return;
  std::fprintf(stderr, "\rbound %.2f GB of weights (%lld repacked, %lld reused, %lld in place)\n",
               bound_bytes_ / 1e9, static_cast<long long>(stats_.files_written),
               static_cast<long long>(stats_.files_reused),
               static_cast<long long>(stats_.in_place));
  std::fflush(stderr);
  line_open_ = false;
}

// ---- binding ----

void dequantize_fp8_block_rows(const uint8_t* fp8, const float* scale_inv, int64_t rows,
                               int64_t cols, int64_t br, int64_t bc, int64_t row_begin,
                               int64_t row_end, float* out) {
  (void)rows;
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = f8e4m3_to_f32(static_cast<uint8_t>(v));
  const int64_t scale_cols = ceil_div(cols, bc);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* srow = scale_inv + (r / br) * scale_cols;
    const uint8_t* in = fp8 + r * cols;
    float* o = out + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const float s = srow[c0 / bc];
      const int64_t c1 = std::min(cols, c0 + bc);
      for (int64_t c = c0; c < c1; ++c) o[c] = lut[in[c]] * s;
    }
  }
}

namespace {

Status check_shape_2d(const TensorView& t, int64_t rows, int64_t cols) {
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols) {
    return invalid_argument("{}: tensor '{}': wrong shape: expected [{}, {}], found {} ({})",
                            t.file, t.name, rows, cols, t.shape_string(), dtype_name(t.dtype));
  }
  return {};
}

// The F32 block scales `<name>_scale_inv` of the F8_E4M3 tensor t [rows, cols].
Result<const TensorView*> find_fp8_scales(const Checkpoint& ckpt, const TensorView& t, int64_t rows,
                                          int64_t cols, int64_t block_rows, int64_t block_cols) {
  const std::string sname = t.name + "_scale_inv";
  const TensorView* s = ckpt.find(sname);
  const int64_t sr = ceil_div(rows, block_rows), sc = ceil_div(cols, block_cols);
  if (s == nullptr) {
    return not_found(
        "{}: tensor '{}' is F8_E4M3 but its block scales '{}' (F32 [{}, {}]) "
        "are missing",
        t.file, t.name, sname, sr, sc);
  }
  if (s->dtype != DType::kF32 || s->shape.size() != 2 || s->shape[0] != sr || s->shape[1] != sc) {
    return invalid_argument(
        "{}: tensor '{}': wrong scales for {}x{} blocks of [{}, {}]: "
        "expected F32 [{}, {}], found {} {}",
        s->file, sname, block_rows, block_cols, rows, cols, sr, sc, dtype_name(s->dtype),
        s->shape_string());
  }
  return s;
}

// Scales may sit at any 4-byte-unaligned offset in the file: copied (small).
std::vector<float> copy_scales(const TensorView& s) {
  std::vector<float> scales(static_cast<size_t>(s.nbytes / 4));
  std::memcpy(scales.data(), s.data, scales.size() * 4);
  return scales;
}

// An F8_E4M3 linear weight as FP8 panels (MatrixLayout::kPanels16, tensor/matrix.h): one
// repack file holding the panels, then the per-panel scales from a 64-byte boundary. Empty
// when its blocks or scales do not suit the panel kernel (block_rows not a multiple of 16,
// block_cols not a power of two, a scale not finite or of 2^120 or more): bind_matrix's F32
// then.
// An element 0x7f or 0xff (NaN in E4M3, which has no infinities) is refused, naming where.
Result<std::optional<MatrixRef>> bind_fp8_panels(const Checkpoint& ckpt, const TensorView& t,
                                                 int64_t rows, int64_t cols, RepackCache& cache,
                                                 int64_t block_rows, int64_t block_cols) {
  XDS_RETURN_IF_ERROR(check_shape_2d(t, rows, cols));
  XDS_ASSIGN_OR_RETURN(const TensorView* s,
                       find_fp8_scales(ckpt, t, rows, cols, block_rows, block_cols));
  const std::vector<float> scale_inv = copy_scales(*s);
  if (block_rows % kPanelRows != 0 || !std::has_single_bit(static_cast<uint64_t>(block_cols)) ||
      !kernels::fp8_panel_scales_fit(scale_inv.data(), static_cast<int64_t>(scale_inv.size()))) {
    return std::optional<MatrixRef>();
  }
  MatrixRef m{DType::kF8E4M3, nullptr, rows, cols, MatrixLayout::kPanels16};
  m.scale_shift = std::countr_zero(static_cast<uint64_t>(block_cols));
  const int64_t panel_bytes = (m.bytes() + 63) / 64 * 64;
  const int64_t scale_count = m.stored_panels() * m.scale_blocks();
  const auto* q = reinterpret_cast<const uint8_t*>(t.data);
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          repack_key(t, s, "F8-panel-pairs16-scales-x2^8", block_rows, block_cols),
          static_cast<size_t>(panel_bytes + scale_count * 4), [&](std::byte* out) -> Status {
            std::atomic<int64_t> nan_at{-1};
            for_range(cache.pool(), m.panels(), [&](int64_t b, int64_t e) {
              for (int64_t p = b; p < e; ++p) {  // each panel's rows checked, then packed
                const int64_t end = std::min(rows * cols, (p + 1) * kPanelRows * cols);
                for (int64_t i = p * kPanelRows * cols; i < end; ++i) {
                  if ((q[i] & 0x7f) == 0x7f) {  // keep the lowest index any thread found
                    int64_t seen = nan_at.load();
                    while ((seen < 0 || i < seen) && !nan_at.compare_exchange_weak(seen, i)) {
                    }
                    return;
                  }
                }
                kernels::pack_panels16_fp8(q, rows, cols, p, p + 1,
                                           reinterpret_cast<uint8_t*>(out));
              }
            });
            if (const int64_t i = nan_at.load(); i >= 0) {
              return invalid_argument(
                  "{}: tensor '{}': element [{}, {}] is 0x{:02x}, a NaN in F8_E4M3", t.file, t.name,
                  i / cols, i % cols, q[i]);
            }
            kernels::pack_fp8_panel_scales(scale_inv.data(), rows, cols, block_rows, block_cols,
                                           reinterpret_cast<float*>(out + panel_bytes));
            return {};
          }));
  m.data = p;
  m.scales = reinterpret_cast<const float*>(p + panel_bytes);
  cache.note_bound(ckpt, t.nbytes + s->nbytes);
  return std::optional<MatrixRef>(m);
}

// Whether t's 16-bit elements (BF16, F16) can be read in place from the mapping.
bool sixteen_bit_in_place(const TensorView& t) {
  return (t.dtype == DType::kBF16 || t.dtype == DType::kF16) &&
         reinterpret_cast<uintptr_t>(t.data) % 2 == 0;
}

// A BF16 or F16 linear weight [rows, cols] (shape checked) as panels of its own elements in
// the repack cache (MatrixLayout::kPanels16).
Result<MatrixRef> bind_panels16(const TensorView& t, int64_t rows, int64_t cols,
                                RepackCache& cache) {
  MatrixRef packed{t.dtype, nullptr, rows, cols, MatrixLayout::kPanels16};
  const auto* src = reinterpret_cast<const uint16_t*>(t.data);
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          repack_key(t, nullptr, fmt::format("{}-panel-pairs16", dtype_name(t.dtype)), 0, 0),
          static_cast<size_t>(packed.bytes()), [&](std::byte* out) -> Status {
            for_range(cache.pool(), packed.panels(), [&](int64_t b, int64_t e) {
              kernels::pack_panels16(src, rows, cols, b, e, reinterpret_cast<uint16_t*>(out));
            });
            return {};
          }));
  packed.data = p;
  return packed;
}

}  // namespace

std::string repack_key(const TensorView& t, const TensorView* scale, std::string_view target,
                       int64_t br, int64_t bc) {
  std::string key = fmt::format("v1|{}|{}|{}|{}|{}", file_identity(t.file), t.name,
                                dtype_name(t.dtype), t.shape_string(), target);
  if (scale != nullptr) {
    key += fmt::format("|{}|{}|{}x{}", file_identity(scale->file), scale->name, br, bc);
  }
  return key;
}

Result<MatrixRef> bind_matrix(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                              int64_t cols, RepackCache& cache, int64_t block_rows,
                              int64_t block_cols) {
  const TensorView* t = ckpt.find(name);
  if (t == nullptr) {
    return not_found("{}: missing tensor '{}' (expected shape [{}, {}])", ckpt.dir(), name, rows,
                     cols);
  }
  XDS_RETURN_IF_ERROR(check_shape_2d(*t, rows, cols));
  MatrixRef m;
  m.rows = rows;
  m.cols = cols;
  const size_t numel = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t->data);
  switch (t->dtype) {
    case DType::kBF16:
    case DType::kF32:
      if (addr % dtype_size(t->dtype) == 0) {
        m.dtype = t->dtype;
        m.data = t->data;
        ++cache.mutable_stats().in_place;
        cache.note_bound(ckpt, t->nbytes);
        return m;
      }
      [[fallthrough]];  // misaligned in the file: repack to F32
    case DType::kF16: {
      const DType src = t->dtype;
      const std::byte* in = t->data;
      XDS_ASSIGN_OR_RETURN(
          const std::byte* p,
          cache.get_or_create(
              repack_key(*t, nullptr, "F32", 0, 0), numel * 4, [&](std::byte* out) -> Status {
                auto* o = reinterpret_cast<float*>(out);
                for_range(cache.pool(), static_cast<int64_t>(numel), [&](int64_t b, int64_t e) {
                  for (int64_t i = b; i < e; ++i) {
                    if (src == DType::kF32) {
                      std::memcpy(o + i, in + 4 * i, 4);
                      continue;
                    }
                    uint16_t h;
                    std::memcpy(&h, in + 2 * i, 2);
                    o[i] = src == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
                  }
                });
                return {};
              }));
      m.dtype = DType::kF32;
      m.data = p;
      cache.note_bound(ckpt, t->nbytes);
      return m;
    }
    case DType::kF8E4M3: {
      XDS_ASSIGN_OR_RETURN(const TensorView* s,
                           find_fp8_scales(ckpt, *t, rows, cols, block_rows, block_cols));
      const std::vector<float> scales = copy_scales(*s);
      const auto* q = reinterpret_cast<const uint8_t*>(t->data);
      XDS_ASSIGN_OR_RETURN(
          const std::byte* p,
          cache.get_or_create(repack_key(*t, s, "F32", block_rows, block_cols), numel * 4,
                              [&](std::byte* out) -> Status {
                                auto* o = reinterpret_cast<float*>(out);
                                for_range(cache.pool(), rows, [&](int64_t b, int64_t e) {
                                  dequantize_fp8_block_rows(q, scales.data(), rows, cols,
                                                            block_rows, block_cols, b, e, o);
                                });
                                return {};
                              }));
      m.dtype = DType::kF32;
      m.data = p;
      cache.note_bound(ckpt, t->nbytes + s->nbytes);
      return m;
    }
    default:
      return unimplemented(
          "{}: tensor '{}': dtype {} cannot be a weight matrix (expected BF16, "
          "F32, F16 or F8_E4M3)",
          t->file, name, dtype_name(t->dtype));
  }
}

Result<MatrixRef> bind_linear(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                              int64_t cols, RepackCache& cache, int64_t block_rows,
                              int64_t block_cols) {
  const TensorView* t = ckpt.find(name);
  if (t != nullptr && panels_from_env()) {
    if (t->dtype == DType::kF8E4M3) {
      XDS_ASSIGN_OR_RETURN(std::optional<MatrixRef> fp8,
                           bind_fp8_panels(ckpt, *t, rows, cols, cache, block_rows, block_cols));
      if (fp8) return *fp8;
    } else if (sixteen_bit_in_place(*t)) {  // BF16 or F16: panels of its own elements
      XDS_RETURN_IF_ERROR(check_shape_2d(*t, rows, cols));
      cache.note_bound(ckpt, t->nbytes);
      return bind_panels16(*t, rows, cols, cache);
    }
  }
  return bind_matrix(ckpt, name, rows, cols, cache, block_rows, block_cols);
}

Result<AbsorbedHeads> bind_absorbed_heads(const Checkpoint& ckpt, const std::string& name,
                                          const MatrixRef& kv_b, int64_t heads, int64_t dn,
                                          int64_t dv, RepackCache& cache) {
  AbsorbedHeads out;
  const TensorView* t = ckpt.find(name);
  XDS_CHECK(t != nullptr, "bind_absorbed_heads: '{}' was bound but is not in the checkpoint", name);
  // BF16 or F16 elements straight from the checkpoint (kv_b itself may be their F32 rows).
  if (kv_b.layout != MatrixLayout::kRows || !sixteen_bit_in_place(*t) || !panels_from_env())
    return out;
  const int64_t lat = kv_b.cols;
  XDS_CHECK(kv_b.rows == heads * (dn + dv), "bind_absorbed_heads: kv_b_proj has {} rows", kv_b.rows);
  // Per head: uk_t [lat, dn] then uv [dv, lat], each its own padded panel matrix.
  const MatrixRef uk_shape{t->dtype, nullptr, lat, dn, MatrixLayout::kPanels16};
  const MatrixRef uv_shape{t->dtype, nullptr, dv, lat, MatrixLayout::kPanels16};
  const int64_t per_head = uk_shape.bytes() + uv_shape.bytes();
  const auto* src = reinterpret_cast<const uint16_t*>(t->data);
  XDS_ASSIGN_OR_RETURN(
      const std::byte* p,
      cache.get_or_create(
          repack_key(*t, nullptr,
                     fmt::format("{}-absorbed-heads-panel-pairs16", dtype_name(t->dtype)), 0, 0),
          static_cast<size_t>(heads * per_head), [&](std::byte* dst) -> Status {
            for_range(cache.pool(), heads, [&](int64_t h0, int64_t h1) {
              std::vector<uint16_t> uk_t(static_cast<size_t>(lat * dn));
              for (int64_t h = h0; h < h1; ++h) {
                const uint16_t* uk = src + h * (dn + dv) * lat;  // [dn, lat]
                for (int64_t i = 0; i < dn; ++i)
                  for (int64_t c = 0; c < lat; ++c) uk_t[c * dn + i] = uk[i * lat + c];
                auto* head = reinterpret_cast<uint16_t*>(dst + h * per_head);
                kernels::pack_panels16(uk_t.data(), lat, dn, 0, uk_shape.panels(), head);
                kernels::pack_panels16(uk + dn * lat, dv, lat, 0, uv_shape.panels(),
                                       head + uk_shape.bytes() / 2);
              }
            });
            return {};
          }));
  for (int64_t h = 0; h < heads; ++h) {
    MatrixRef uk = uk_shape, uv = uv_shape;
    uk.data = p + h * per_head;
    uv.data = p + h * per_head + uk_shape.bytes();
    out.uk_t.push_back(uk);
    out.uv.push_back(uv);
  }
  return out;
}

Result<std::span<const float>> bind_vector_f32(const Checkpoint& ckpt, const std::string& name,
                                               int64_t n, RepackCache& cache) {
  const TensorView* t = ckpt.find(name);
  if (t == nullptr) {
    return not_found("{}: missing tensor '{}' (expected shape [{}])", ckpt.dir(), name, n);
  }
  if (t->shape.size() != 1 || t->shape[0] != n) {
    return invalid_argument("{}: tensor '{}': wrong shape: expected [{}], found {} ({})", t->file,
                            name, n, t->shape_string(), dtype_name(t->dtype));
  }
  cache.note_bound(ckpt, t->nbytes);
  if (t->dtype == DType::kF32 && reinterpret_cast<uintptr_t>(t->data) % 4 == 0) {
    ++cache.mutable_stats().in_place;
    return std::span<const float>(reinterpret_cast<const float*>(t->data), static_cast<size_t>(n));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return unimplemented(
        "{}: tensor '{}': dtype {} cannot be a vector of weights (expected "
        "F32, BF16 or F16)",
        t->file, name, dtype_name(t->dtype));
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (t->dtype == DType::kF32) {
      std::memcpy(&v[i], t->data + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      v[i] = t->dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  ++cache.mutable_stats().vectors_converted;
  return cache.keep(std::move(v));
}

}  // namespace xds
