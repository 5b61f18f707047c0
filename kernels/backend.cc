#include "kernels/backend.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ridgeserve {

HostTensor HostTensor::Rows(int64_t begin, int64_t count) const {
  HostTensor out = *this;
  out.data = data + static_cast<size_t>(begin) * row_bytes;
  out.rows = count;
  return out;
}

absl::StatusOr<HostTensor> HostTensor::Cols(int64_t begin, int64_t count) const {
  absl::StatusOr<TypeTraits> traits = GetTypeTraits(dtype);
  if (!traits.ok()) return traits.status();
  if (begin < 0 || count < 0 || begin + count > cols || begin % traits->block_elements != 0 ||
      count % traits->block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("columns [", begin, ", ", begin + count, ") of ", cols, " are not whole ",
                     std::string(traits->name), " blocks of ", traits->block_elements));
  }
  HostTensor out = *this;
  out.data = data + static_cast<size_t>(begin / traits->block_elements) * traits->block_bytes;
  out.cols = count;
  return out;
}

absl::StatusOr<DType> ResolveKvCacheDType(std::string_view name, const Backend& backend) {
  if (name == "auto") return backend.DefaultKvCacheDType();
  absl::StatusOr<DType> dtype = ParseKvCacheDType(name);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_dtype '", std::string(name), "': want auto, f32, bf16 or f16"));
  }
  return dtype;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) backend_->FreeRaw(data_);
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) backend_->FreeRaw(data_);
}

}  // namespace ridgeserve
