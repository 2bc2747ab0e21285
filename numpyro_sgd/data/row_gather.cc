// numpyro_sgd's native row reader: an XLA FFI handler that copies the rows a minibatch asks for
// from host arrays (NumPy memmaps, or in-memory NumPy arrays) straight into the compiled step's
// buffer, with no Python on the way. Built and loaded by numpyro_sgd/data/native.py on first use.
//
// The rows are those of one array, or of several stacked by rows (a directory of .npy shards):
// part k holds rows offsets[k] .. offsets[k+1] - 1 and starts at address bases[k].
// Input: the row indices (int32 or int64, any shape). Result: the rows, in index order.
// Attributes: bases (one address per part), offsets (the parts' first rows, then the number of
// rows), stride (bytes from a row to the next within a part; negative for a reversed view),
// row_bytes (the bytes of one source row's elements), item_bytes (of one element), elem_stride
// (bytes from an element of a row to the next: item_bytes for rows in C order, N * item_bytes for
// a Fortran-order matrix), convert (0: rows are copied as they are;
// 1: float64 -> float32, 2: int64 -> int32, 3: uint64 -> uint32, the casts JAX applies to such data
// without jax_enable_x64; a result row is then half a source row) and the array's name for error
// messages; and the memory-mapped files behind the parts as the run found them (files: their
// paths, one per line; file_stamps: size, modification time in ns, inode and the bytes the
// mapping needs, four int64 per file), compared with the files at most every 10 ms, so that a
// file changed under a run stops it with an error naming the file instead of giving wrong rows or
// a SIGBUS at the next read of a truncated page. A run of consecutive indices (a cluster of the cluster law) is copied by one memcpy
// per part it spans when rows are packed (stride == row_bytes) and not converted.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One element of a row: copied, or cast (From -> To) when the rows are narrowed.
template <typename From, typename To>
inline void put(const uint8_t* src, uint8_t* dst) {
  From value;
  std::memcpy(&value, src, sizeof(From));  // a row need not be aligned
  const To cast = static_cast<To>(value);
  std::memcpy(dst, &cast, sizeof(To));
}

// `rows` rows from src (a row every `stride` bytes, its `elems` elements every `elem_stride`
// bytes) to packed result rows at dst, element by element, in the order of the source's memory:
// a row at a time when a row's elements are closer together than the rows (C order), else a
// column at a time, so that a run of consecutive rows of a Fortran-order matrix is read in order.
template <typename From, typename To>
void strided(const uint8_t* src, int64_t rows, int64_t stride, int64_t elems, int64_t elem_stride, uint8_t* dst) {
  const int64_t out_item = static_cast<int64_t>(sizeof(To));
  const int64_t out_row = elems * out_item;
  const auto magnitude = [](int64_t v) { return v < 0 ? -v : v; };
  if (magnitude(elem_stride) <= magnitude(stride)) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t e = 0; e < elems; ++e) put<From, To>(src + r * stride + e * elem_stride, dst + r * out_row + e * out_item);
    }
    return;
  }
  for (int64_t e = 0; e < elems; ++e) {
    if (e + 4 < elems) {  // the columns ahead are far apart in memory: ask for their rows early
      for (int64_t b = 0; b < rows * stride; b += 64) __builtin_prefetch(src + (e + 4) * elem_stride + b);
    }
    for (int64_t r = 0; r < rows; ++r) put<From, To>(src + r * stride + e * elem_stride, dst + r * out_row + e * out_item);
  }
}

struct Rows {
  ffi::Span<const uint64_t> bases;
  ffi::Span<const int64_t> offsets;
  int64_t stride;
  int64_t row_bytes;
  int64_t item_bytes;
  int64_t elem_stride;
  int64_t convert;
  std::string_view name;

  int64_t count() const { return offsets[offsets.size() - 1]; }
  int64_t out_row_bytes() const { return convert == 0 ? row_bytes : row_bytes / 2; }
  bool packed_row() const { return elem_stride == item_bytes || row_bytes == item_bytes; }

  // `rows` rows from src to dst, converted when `convert` says so.
  void copy_rows(const uint8_t* src, int64_t rows, uint8_t* dst) const {
    const int64_t elems = row_bytes / item_bytes;
    // a packed row is one element of row_bytes (no cast) or elements one after the other
    const int64_t step = packed_row() ? item_bytes : elem_stride;
    switch (convert) {
      case 1: return strided<double, float>(src, rows, stride, elems, step, dst);
      case 2: return strided<int64_t, int32_t>(src, rows, stride, elems, step, dst);
      case 3: return strided<uint64_t, uint32_t>(src, rows, stride, elems, step, dst);
      default: break;
    }
    if (packed_row()) {
      for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * row_bytes, src + r * stride, row_bytes);
      return;
    }
    switch (item_bytes) {
      case 1: return strided<uint8_t, uint8_t>(src, rows, stride, elems, elem_stride, dst);
      case 2: return strided<uint16_t, uint16_t>(src, rows, stride, elems, elem_stride, dst);
      case 4: return strided<uint32_t, uint32_t>(src, rows, stride, elems, elem_stride, dst);
      default: return strided<uint64_t, uint64_t>(src, rows, stride, elems, elem_stride, dst);
    }
  }

  // Copies rows first .. first + n - 1 (all inside the data) to dst.
  void copy(int64_t first, int64_t n, uint8_t* dst) const {
    while (n > 0) {
      // the part holding row `first`: the last k with offsets[k] <= first
      const int64_t k = std::upper_bound(offsets.begin(), offsets.end() - 1, first) - offsets.begin() - 1;
      const int64_t take = std::min(n, offsets[k + 1] - first);
      const auto* src = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(bases[k])) +
                        (first - offsets[k]) * stride;
      if (stride == row_bytes && convert == 0 && packed_row()) {
        std::memcpy(dst, src, static_cast<size_t>(take * row_bytes));
      } else {
        copy_rows(src, take, dst);
      }
      dst += take * out_row_bytes();
      first += take;
      n -= take;
    }
  }
};

// What changed in a file since its stamp ("" when nothing did), as numpyro_sgd.streaming._changed says it.
std::string Changed(const std::string& path, const int64_t* stamp) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "it can no longer be read";
#ifdef __APPLE__
  const int64_t mtime = static_cast<int64_t>(st.st_mtimespec.tv_sec) * 1000000000 + st.st_mtimespec.tv_nsec;
#else
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
#endif
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (static_cast<int64_t>(st.st_ino) != stamp[2]) return "another file now has its path (it was replaced)";
  if (size < stamp[3]) {
    return "it is " + std::to_string(size) + " bytes, shorter than the " + std::to_string(stamp[3]) +
           " mapped (it was truncated)";
  }
  if (size != stamp[0]) return "its size went from " + std::to_string(stamp[0]) + " to " + std::to_string(size) + " bytes";
  if (mtime != stamp[1]) return "it was written to (its modification time changed)";
  return "";
}

// Compare the files of a source (keyed by its first part's address) with their stamps, at most
// every 10 ms per source: an error naming the first file that changed, or success.
ffi::Error CheckFiles(uint64_t key, std::string_view paths, ffi::Span<const int64_t> stamps, std::string_view name) {
  if (paths.empty()) return ffi::Error::Success();
  static std::mutex mutex;
  static std::unordered_map<uint64_t, int64_t> last;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = last.find(key);
    if (it != last.end() && now - it->second < 10000000) return ffi::Error::Success();
    last[key] = now;
  }
  size_t start = 0;
  for (size_t k = 0; start <= paths.size() && 4 * k + 3 < stamps.size(); ++k) {
    size_t end = paths.find('\n', start);
    if (end == std::string_view::npos) end = paths.size();
    const std::string path(paths.substr(start, end - start));
    const std::string why = Changed(path, stamps.begin() + 4 * k);
    if (!why.empty()) {
      return ffi::Error::InvalidArgument(
          std::string(name) + ": the file " + path + " changed since the run opened it: " + why +
          ". Its rows are no longer the ones the run read, and a memory-mapped file that shrinks kills the "
          "process that reads it (SIGBUS). Open it again (np.load(path, mmap_mode='r')) and pass the new array; "
          "to change the data while a run reads them, write a new file and keep the old one, or run from a copy.");
    }
    start = end + 1;
  }
  return ffi::Error::Success();
}

template <typename Index>
ffi::Error Gather(const Index* idx, int64_t n, uint8_t* dst, const Rows& rows) {
  const int64_t count = rows.count();
  int64_t i = 0;
  while (i < n) {
    const int64_t start = static_cast<int64_t>(idx[i]);
    int64_t j = i + 1;
    while (j < n && static_cast<int64_t>(idx[j]) == static_cast<int64_t>(idx[j - 1]) + 1) ++j;
    if (start < 0 || start + (j - i) > count) {
      const int64_t bad = start < 0 ? start : std::max(start, count);
      // the words numpyro_sgd's index check looks for (streaming.PAST_THE_DATA, OUT_OF_RANGE)
      return ffi::Error::InvalidArgument(std::string(rows.name) + ": row " + std::to_string(bad) +
                                         " asked of data with " + std::to_string(count) +
                                         " rows (a row index i of an N-row array needs -N <= i < N)");
    }
    rows.copy(start, j - i, dst + i * rows.out_row_bytes());
    i = j;
  }
  return ffi::Error::Success();
}

ffi::Error RowGather(ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out, ffi::Span<const uint64_t> bases,
                     ffi::Span<const int64_t> offsets, int64_t stride, int64_t row_bytes, int64_t item_bytes,
                     int64_t elem_stride, int64_t convert, std::string_view name, std::string_view files,
                     ffi::Span<const int64_t> file_stamps) {
  const Rows rows{bases, offsets, stride, row_bytes, item_bytes, elem_stride, convert, name};
  if (bases.size() == 0 || offsets.size() != bases.size() + 1) {
    return ffi::Error::InvalidArgument(std::string(name) + ": one offset per part and the row count are needed");
  }
  if (ffi::Error checked = CheckFiles(bases[0], files, file_stamps, name); checked.failure()) return checked;
  if (convert < 0 || convert > 3 || (convert != 0 && item_bytes != 8) || item_bytes <= 0 ||
      row_bytes % item_bytes != 0 || (item_bytes > 8 && elem_stride != item_bytes && row_bytes != item_bytes) ||
      (item_bytes & (item_bytes - 1)) != 0) {
    return ffi::Error::InvalidArgument(std::string(name) + ": rows of this layout or conversion cannot be read");
  }
  const int64_t n = static_cast<int64_t>(idx.element_count());
  if (out->size_bytes() != static_cast<size_t>(n * rows.out_row_bytes())) {
    return ffi::Error::InvalidArgument(std::string(name) + ": the result buffer does not hold the rows asked");
  }
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  switch (idx.element_type()) {
    case ffi::DataType::S32:
      return Gather(static_cast<const int32_t*>(idx.untyped_data()), n, dst, rows);
    case ffi::DataType::S64:
      return Gather(static_cast<const int64_t*>(idx.untyped_data()), n, dst, rows);
    default:
      return ffi::Error::InvalidArgument(std::string(name) + ": row indices must be int32 or int64");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(numpyro_sgd_row_gather, RowGather,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const uint64_t>>("bases")
                                  .Attr<ffi::Span<const int64_t>>("offsets")
                                  .Attr<int64_t>("stride")
                                  .Attr<int64_t>("row_bytes")
                                  .Attr<int64_t>("item_bytes")
                                  .Attr<int64_t>("elem_stride")
                                  .Attr<int64_t>("convert")
                                  .Attr<std::string_view>("name")
                                  .Attr<std::string_view>("files")
                                  .Attr<ffi::Span<const int64_t>>("file_stamps"));
