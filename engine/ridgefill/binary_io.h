// The container both RidgeFill binary files share (the map file, map_file.h, and the
// calibration-statistics file, stats_file.h); private to engine/ridgefill.
//
// A container is little-endian throughout:
//   [0, 64)  header
//     char[8] magic                     u32 version              u32 header size (64)
//     u64 file size (all bytes, trailer included)
//     u64 metadata offset (64)          u64 metadata size        u64 data offset (64-aligned)
//     16 bytes zero
//   metadata, packed (each format defines its own), where an array is referred to as
//     u64 file offset, u64 element count (offset 0 when empty)
//   data: the arrays, each starting at a multiple of 64, zero padding between them
//   trailer: u64 XXH64 (seed 0) of every byte before the trailer, char[8] end magic
// Writing streams the arrays from the caller's memory into a temporary file renamed into
// place; reading maps the file and checks the envelope (magic, version, size, trailer,
// checksum, header layout) before a format parses its metadata with Decoder and DataSection,
// which check every count and offset against the file before anything is allocated.
#ifndef RIDGESERVE_ENGINE_RIDGEFILL_BINARY_IO_H_
#define RIDGESERVE_ENGINE_RIDGEFILL_BINARY_IO_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/mapped_file.h"

namespace ridgeserve::binary_io {

inline constexpr uint64_t kHeaderSize = 64;
inline constexpr uint64_t kTrailerSize = 16;
inline constexpr uint64_t kAlign = 64;
inline constexpr uint64_t kArrayRefSize = 16;  // u64 offset, u64 count

inline uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// One file format in the container.
struct Format {
  char magic[8];
  char end_magic[8];
  uint32_t version;
  // What people call it, for errors: "not a RidgeFill <noun> (bad magic)".
  absl::string_view noun;
};

// ---- Writing -------------------------------------------------------------------------------

// Little-endian encoder into a byte string (the header and the metadata block).
class Encoder {
 public:
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void Raw(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Lays out the data section: each array placed gets the next 64-aligned offset, its reference
// goes into the metadata, and WriteContainer streams it from the caller's memory, which must
// live until then.
class ArrayLayout {
 public:
  explicit ArrayLayout(uint64_t data_offset) : data_offset_(data_offset), end_(data_offset) {}

  template <typename T>
  void Place(std::span<const T> a, Encoder& meta) {
    PlaceBytes(a.data(), a.size(), sizeof(T), meta);
  }
  struct Placed {
    const void* data;
    uint64_t bytes;
    uint64_t offset;
  };
  uint64_t data_offset() const { return data_offset_; }
  uint64_t end() const { return end_; }  // end of the last array: where the trailer goes
  const std::vector<Placed>& arrays() const { return arrays_; }

 private:
  void PlaceBytes(const void* data, uint64_t count, uint64_t element_size, Encoder& meta);

  uint64_t data_offset_;
  uint64_t end_;
  std::vector<Placed> arrays_;
};

// Writes header, `meta`, the arrays and the trailer to `path` atomically: a temporary file
// renamed into place. The arrays' data offset must be AlignUp(kHeaderSize + meta size) (the
// format predicts its metadata size before placing arrays; Internal when it got it wrong).
// Errors start with `error_prefix` (which names the file).
absl::Status WriteContainer(const std::string& path, absl::string_view error_prefix,
                            const Format& format, const Encoder& meta, const ArrayLayout& arrays);

// ---- Reading -------------------------------------------------------------------------------

// Bounds-checked little-endian reads over the metadata block.
class Decoder {
 public:
  Decoder(const uint8_t* p, uint64_t size) : p_(p), size_(size) {}
  uint64_t remaining() const { return size_ - pos_; }
  bool U32(uint32_t& v) { return Raw(&v, 4); }
  bool U64(uint64_t& v) { return Raw(&v, 8); }
  bool I64(int64_t& v) { return Raw(&v, 8); }
  bool F32(float& v) { return Raw(&v, 4); }
  bool Raw(void* out, uint64_t n) {
    if (n > remaining()) return false;
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
    return true;
  }
  bool String(uint64_t n, std::string& out) {
    if (n > remaining()) return false;
    out.assign(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// A container mapped read-only whose envelope checked out.
struct Container {
  std::unique_ptr<MappedFile> file;
  uint64_t meta_offset = 0;
  uint64_t meta_size = 0;
  uint64_t data_offset = 0;
  uint64_t payload_end = 0;  // first byte of the trailer
  uint64_t checksum = 0;     // the trailer's XXH64, verified

  Decoder Metadata() const { return Decoder(file->data() + meta_offset, meta_size); }
};

// Maps `path` and checks magic, version, file size, trailer and checksum, then the header's
// layout. Errors are one line starting with `error_prefix`: NotFound etc. from opening,
// DataLoss for a truncated or corrupted file, InvalidArgument for a wrong magic or version.
absl::StatusOr<Container> OpenContainer(const std::string& path, absl::string_view error_prefix,
                                        const Format& format);

// The data section of an open container: resolves array references from the metadata.
class DataSection {
 public:
  enum class Order {
    kAny,  // arrays may overlap (read in place as views, so overlap costs nothing)
    // each array starts at or after the previous one's end: what is copied out is then
    // bounded by the file size however many references the metadata holds
    kDisjointAscending,
  };
  // `error_prefix` must outlive the DataSection.
  DataSection(const Container& c, absl::string_view error_prefix, Order order)
      : base_(c.file->data()),
        data_offset_(c.data_offset),
        payload_end_(c.payload_end),
        error_prefix_(error_prefix),
        order_(order),
        next_free_(c.data_offset) {}

  // DataLoss "<prefix>: <what>".
  absl::Status Error(absl::string_view what) const;

  // The next array reference in `dec`, as a view into the file.
  template <typename T>
  absl::StatusOr<std::span<const T>> View(Decoder& dec, absl::string_view what) {
    uint64_t count = 0;
    absl::StatusOr<const uint8_t*> p = Locate(dec, what, sizeof(T), count);
    if (!p.ok()) return p.status();
    return std::span<const T>(reinterpret_cast<const T*>(*p), count);
  }
  // The next array reference in `dec`, copied into `out`.
  template <typename T>
  absl::Status Copy(Decoder& dec, absl::string_view what, std::vector<T>& out) {
    uint64_t count = 0;
    absl::StatusOr<const uint8_t*> p = Locate(dec, what, sizeof(T), count);
    if (!p.ok()) return p.status();
    out.resize(count);
    if (count > 0) std::memcpy(out.data(), *p, count * sizeof(T));
    return absl::OkStatus();
  }

 private:
  // Checks the reference (64-aligned, inside the data section, in order when asked) and
  // returns where the array starts (nullptr when empty) and its element count.
  absl::StatusOr<const uint8_t*> Locate(Decoder& dec, absl::string_view what, uint64_t element_size,
                                        uint64_t& count);

  const uint8_t* base_;
  uint64_t data_offset_;
  uint64_t payload_end_;
  absl::string_view error_prefix_;
  Order order_;
  uint64_t next_free_;  // end of the last array (kDisjointAscending)
};

}  // namespace ridgeserve::binary_io

#endif  // RIDGESERVE_ENGINE_RIDGEFILL_BINARY_IO_H_
