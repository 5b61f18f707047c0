#include "engine/ridgefill/binary_io.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "engine/ridgefill/xxh64.h"

namespace ridgeserve::binary_io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "RidgeFill files are little-endian and read in place");

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

// Writes to a FILE*, hashing and counting every byte; the first failure sticks.
class HashingWriter {
 public:
  explicit HashingWriter(std::FILE* f) : f_(f) {}
  void Write(const void* p, size_t n) {
    if (!ok_ || n == 0) return;
    hash_.Update(p, n);
    pos_ += n;
    ok_ = std::fwrite(p, 1, n, f_) == n;
  }
  void PadTo(uint64_t offset) {
    static constexpr char kZeros[kAlign] = {};
    while (pos_ < offset) Write(kZeros, std::min<uint64_t>(kAlign, offset - pos_));
  }
  bool ok() const { return ok_; }
  uint64_t pos() const { return pos_; }
  uint64_t digest() const { return hash_.Digest(); }

 private:
  std::FILE* f_;
  Xxh64 hash_;
  uint64_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

void ArrayLayout::PlaceBytes(const void* data, uint64_t count, uint64_t element_size,
                             Encoder& meta) {
  if (count == 0) {
    meta.U64(0);
    meta.U64(0);
    return;
  }
  const uint64_t offset = AlignUp(end_);
  arrays_.push_back({data, count * element_size, offset});
  end_ = offset + count * element_size;
  meta.U64(offset);
  meta.U64(count);
}

absl::Status WriteContainer(const std::string& path, absl::string_view error_prefix,
                            const Format& format, const Encoder& meta, const ArrayLayout& arrays) {
  const uint64_t meta_size = meta.bytes().size();
  if (AlignUp(kHeaderSize + meta_size) != arrays.data_offset()) {
    // The format's writer predicted its metadata size wrongly: a bug, not the user's fault.
    return absl::InternalError(absl::StrCat(error_prefix, ": metadata of ", meta_size,
                                            " bytes does not end just before the data at ",
                                            arrays.data_offset()));
  }
  const uint64_t file_size = arrays.end() + kTrailerSize;
  Encoder header;
  header.Raw(format.magic, 8);
  header.U32(format.version);
  header.U32(kHeaderSize);
  header.U64(file_size);
  header.U64(kHeaderSize);
  header.U64(meta_size);
  header.U64(arrays.data_offset());
  header.U64(0);
  header.U64(0);

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(error_prefix, ": cannot create ", tmp, ": ", std::strerror(errno)));
  }
  HashingWriter w(f);
  w.Write(header.bytes().data(), header.bytes().size());
  w.Write(meta.bytes().data(), meta.bytes().size());
  for (const ArrayLayout::Placed& a : arrays.arrays()) {
    w.PadTo(a.offset);
    w.Write(a.data, a.bytes);
  }
  w.PadTo(arrays.end());  // up to the data offset when there are no arrays
  const uint64_t digest = w.digest();
  w.Write(&digest, 8);
  w.Write(format.end_magic, 8);
  const bool written = w.ok() && w.pos() == file_size;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(
        error_prefix, ": write failed: ", std::strerror(written ? errno : write_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat(error_prefix, ": rename from ", tmp, " failed: ", std::strerror(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Container> OpenContainer(const std::string& path, absl::string_view error_prefix,
                                        const Format& format) {
  Container c;
  RS_ASSIGN_OR_RETURN(c.file, MappedFile::Open(path));
  const uint8_t* base = c.file->data();
  const uint64_t size = c.file->size();
  const auto data_loss = [&](auto&&... parts) {
    return absl::DataLossError(absl::StrCat(error_prefix, ": ", parts...));
  };
  const auto invalid = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(error_prefix, ": ", parts...));
  };
  const auto u32_at = [&](uint64_t off) {
    uint32_t v;
    std::memcpy(&v, base + off, 4);
    return v;
  };
  const auto u64_at = [&](uint64_t off) {
    uint64_t v;
    std::memcpy(&v, base + off, 8);
    return v;
  };

  if (size < sizeof(format.magic)) return data_loss("truncated: ", size, " bytes, no header");
  if (std::memcmp(base, format.magic, sizeof(format.magic)) != 0) {
    return invalid("not a RidgeFill ", format.noun, " (bad magic)");
  }
  if (size < 12) return data_loss("truncated: ", size, " bytes, no version");
  if (const uint32_t version = u32_at(8); version != format.version) {
    return invalid("unsupported ", format.noun, " version ", version, " (this build reads version ",
                   format.version, ")");
  }
  if (size < kHeaderSize + kTrailerSize) {
    return data_loss("truncated: ", size, " bytes, smaller than header and trailer");
  }
  const uint64_t declared_size = u64_at(16);
  if (declared_size != size) {
    return data_loss(declared_size > size ? "truncated: " : "trailing bytes: ", "header says ",
                     declared_size, " bytes, the file has ", size);
  }
  c.payload_end = size - kTrailerSize;
  if (std::memcmp(base + c.payload_end + 8, format.end_magic, sizeof(format.end_magic)) != 0) {
    return data_loss("trailer missing or damaged");
  }
  c.checksum = u64_at(c.payload_end);
  const uint64_t computed = Xxh64Hash(base, c.payload_end);
  if (c.checksum != computed) {
    return data_loss("checksum mismatch (stored ", Hex(c.checksum), ", computed ", Hex(computed),
                     "): the file is corrupted");
  }
  // The checksum vouches for the bytes, not for the writer: check the layout anyway.
  const uint32_t header_size = u32_at(12);
  c.meta_offset = u64_at(24);
  c.meta_size = u64_at(32);
  c.data_offset = u64_at(40);
  if (header_size != kHeaderSize || c.meta_offset != kHeaderSize ||
      c.meta_size > c.payload_end - c.meta_offset || c.data_offset % kAlign != 0 ||
      c.data_offset < c.meta_offset + c.meta_size || c.data_offset > c.payload_end) {
    return data_loss("malformed header (metadata at ", c.meta_offset, " size ", c.meta_size,
                     ", data at ", c.data_offset, ", ", size, " bytes in all)");
  }
  return c;
}

absl::Status DataSection::Error(absl::string_view what) const {
  return absl::DataLossError(absl::StrCat(error_prefix_, ": ", what));
}

absl::StatusOr<const uint8_t*> DataSection::Locate(Decoder& dec, absl::string_view what,
                                                   uint64_t element_size, uint64_t& count) {
  uint64_t offset = 0;
  if (!dec.U64(offset) || !dec.U64(count)) return Error("metadata ends early");
  if (count == 0) {
    if (offset != 0) return Error(absl::StrCat(what, ": empty array with offset ", offset));
    return static_cast<const uint8_t*>(nullptr);
  }
  if (offset % kAlign != 0 || offset < data_offset_ || offset > payload_end_ ||
      count > (payload_end_ - offset) / element_size) {
    return Error(absl::StrCat(what, ": array of ", count, " values of ", element_size,
                              " bytes at offset ", offset, " lies outside the data section [",
                              data_offset_, ", ", payload_end_, ")"));
  }
  if (order_ == Order::kDisjointAscending) {
    if (offset < next_free_) {
      return Error(absl::StrCat(what, ": array at offset ", offset,
                                " overlaps or precedes the one before it (which ends at ",
                                next_free_, ")"));
    }
    next_free_ = offset + count * element_size;
  }
  return base_ + offset;
}

}  // namespace ridgeserve::binary_io
