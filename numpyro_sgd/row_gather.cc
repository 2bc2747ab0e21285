// numpyro_sgd's native row reader: an XLA FFI handler that copies the rows a minibatch asks for
// from a host array (a NumPy memmap or an in-memory NumPy array) straight into the compiled step's
// buffer, with no Python on the way. Built and loaded by numpyro_sgd/native.py on first use.
//
// Inputs: the row indices (int32 or int64, any shape). Result: the rows, in index order.
// Attributes: the array's address (base), the byte step between rows (stride, may be negative
// for a reversed view), the bytes of one row (row_bytes, contiguous), the number of rows and the
// array's name for the error message. Runs of consecutive indices (the cluster law's clusters)
// are copied by one memcpy each when rows are packed (stride == row_bytes).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <typename Index>
ffi::Error CopyRows(const Index* idx, int64_t n, uint8_t* dst, const uint8_t* base, int64_t stride,
                    int64_t row_bytes, int64_t rows, std::string_view name) {
  int64_t i = 0;
  while (i < n) {
    const int64_t start = static_cast<int64_t>(idx[i]);
    int64_t j = i + 1;
    if (stride == row_bytes) {
      while (j < n && static_cast<int64_t>(idx[j]) == static_cast<int64_t>(idx[j - 1]) + 1) ++j;
    }
    if (start < 0 || start + (j - i) > rows) {
      const int64_t bad = start < 0 ? start : start + (j - i) - 1;
      // the words numpyro_sgd's plate check looks for (streaming.PAST_THE_DATA)
      return ffi::Error::InvalidArgument(std::string(name) + ": row " + std::to_string(bad) +
                                         " asked of data with " + std::to_string(rows) +
                                         " rows (a plate larger than the data)");
    }
    std::memcpy(dst + i * row_bytes, base + start * stride, static_cast<size_t>((j - i) * row_bytes));
    i = j;
  }
  return ffi::Error::Success();
}

ffi::Error RowGather(ffi::AnyBuffer idx, ffi::Result<ffi::AnyBuffer> out, uint64_t base, int64_t stride,
                     int64_t row_bytes, int64_t rows, std::string_view name) {
  const int64_t n = static_cast<int64_t>(idx.element_count());
  if (out->size_bytes() != static_cast<size_t>(n * row_bytes)) {
    return ffi::Error::InvalidArgument(std::string(name) + ": the result buffer does not hold the rows asked");
  }
  auto* dst = static_cast<uint8_t*>(out->untyped_data());
  const auto* src = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(base));
  switch (idx.element_type()) {
    case ffi::DataType::S32:
      return CopyRows(static_cast<const int32_t*>(idx.untyped_data()), n, dst, src, stride, row_bytes, rows, name);
    case ffi::DataType::S64:
      return CopyRows(static_cast<const int64_t*>(idx.untyped_data()), n, dst, src, stride, row_bytes, rows, name);
    default:
      return ffi::Error::InvalidArgument(std::string(name) + ": row indices must be int32 or int64");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(numpyro_sgd_row_gather, RowGather,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<uint64_t>("base")
                                  .Attr<int64_t>("stride")
                                  .Attr<int64_t>("row_bytes")
                                  .Attr<int64_t>("rows")
                                  .Attr<std::string_view>("name"));
