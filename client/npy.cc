#include "client/npy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"

namespace ringattn {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              ".npy data is read and written in host byte order");

constexpr absl::string_view kMagic("\x93NUMPY", 6);
// Magic, two version bytes and the shortest (2-byte) header length field.
constexpr size_t kPreambleSize = 10;
// numpy pads the preamble plus header to a multiple of this.
constexpr size_t kHeaderAlignment = 64;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// What the header dict of a .npy file says.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the Python dict literal that a .npy header holds, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }". Accepts only
// what numpy writes for plain arrays: string, bool and int-tuple values.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  absl::StatusOr<NpyHeader> Parse() {
    NpyHeader header;
    bool has_descr = false, has_order = false, has_shape = false;
    if (!Consume('{')) return Malformed("the header is not a dict");
    while (!Consume('}')) {
      absl::StatusOr<std::string> key = ParseString();
      if (!key.ok()) return key.status();
      if (!Consume(':')) return Malformed("expected ':' after a key");
      if (*key == "descr") {
        absl::StatusOr<std::string> descr = ParseString();
        if (!descr.ok()) {
          return absl::InvalidArgumentError(
              "unsupported dtype: structured arrays are not supported");
        }
        header.descr = *std::move(descr);
        has_descr = true;
      } else if (*key == "fortran_order") {
        absl::StatusOr<bool> order = ParseBool();
        if (!order.ok()) return order.status();
        header.fortran_order = *order;
        has_order = true;
      } else if (*key == "shape") {
        absl::StatusOr<std::vector<int64_t>> shape = ParseShape();
        if (!shape.ok()) return shape.status();
        header.shape = *std::move(shape);
        has_shape = true;
      } else {
        return Malformed(absl::StrCat("unexpected key '", *key, "'"));
      }
      if (!Consume(',') && !Peek('}')) {
        return Malformed("expected ',' or '}' after a value");
      }
    }
    SkipSpace();
    if (pos_ != text_.size()) return Malformed("text after the dict");
    if (!has_descr || !has_order || !has_shape) {
      return Malformed("'descr', 'fortran_order' and 'shape' are required");
    }
    return header;
  }

 private:
  static absl::Status Malformed(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed header: ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }

  bool Peek(char c) {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }

  bool Consume(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }

  absl::StatusOr<std::string> ParseString() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Malformed("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return Malformed("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }

  absl::StatusOr<bool> ParseBool() {
    SkipSpace();
    for (const auto& [word, value] :
         {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return Malformed("'fortran_order' must be True or False");
  }

  // A tuple of non-negative ints: "()", "(3,)", "(2, 3)"; numpy under
  // Python 2 wrote longs as "3L".
  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    std::vector<int64_t> shape;
    if (!Consume('(')) return Malformed("'shape' must be a tuple");
    while (!Consume(')')) {
      SkipSpace();
      int64_t dim = 0;
      const size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (__builtin_mul_overflow(dim, 10, &dim) ||
            __builtin_add_overflow(dim, text_[pos_] - '0', &dim)) {
          return Malformed("a 'shape' dimension overflows int64");
        }
        ++pos_;
      }
      if (pos_ == start) {
        return Malformed("'shape' must hold non-negative integers");
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
      shape.push_back(dim);
      if (!Consume(',') && !Peek(')')) {
        return Malformed("expected ',' or ')' in 'shape'");
      }
    }
    return shape;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// A status of `code` whose message starts with the file name.
absl::Status FileError(absl::StatusCode code, const std::string& path,
                       absl::string_view what) {
  return absl::Status(code, absl::StrCat(path, ": ", what));
}

// The number of elements of `shape`, or an error if it overflows the bytes an
// array of `element_size`-byte elements can span.
absl::StatusOr<int64_t> ElementCount(absl::Span<const int64_t> shape,
                                     int64_t element_size) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", dim, " in shape"));
    }
    int64_t bytes;
    if (__builtin_mul_overflow(count, dim, &count) ||
        __builtin_mul_overflow(count, element_size, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape (", absl::StrJoin(shape, ", "), ") is too large"));
    }
  }
  return count;
}

// The bytes of `file` after its read position, or nullopt where that is
// unknown (not a regular file: a pipe, a terminal). Sizes a header claims are
// checked against it before they are allocated.
std::optional<uint64_t> BytesLeft(std::FILE* file) {
  struct stat info;
  const long position = std::ftell(file);
  if (fstat(fileno(file), &info) != 0 || !S_ISREG(info.st_mode) ||
      position < 0 || position > info.st_size) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(info.st_size - position);
}

uint32_t LittleEndian(const unsigned char* bytes, int size) {
  uint32_t value = 0;
  for (int i = size - 1; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

}  // namespace

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  File file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    return FileError(errno == ENOENT ? absl::StatusCode::kNotFound
                                     : absl::StatusCode::kInvalidArgument,
                     path, absl::StrCat("cannot open: ", std::strerror(errno)));
  }
  unsigned char preamble[kPreambleSize + 2];
  if (std::fread(preamble, 1, kPreambleSize, file.get()) != kPreambleSize ||
      absl::string_view(reinterpret_cast<char*>(preamble), kMagic.size()) !=
          kMagic) {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     "not a .npy file (bad magic)");
  }
  const int major = preamble[6], minor = preamble[7];
  size_t length_size;
  if (major == 1 && minor == 0) {
    length_size = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    length_size = 4;
    if (std::fread(preamble + kPreambleSize, 1, 2, file.get()) != 2) {
      return FileError(absl::StatusCode::kInvalidArgument, path,
                       "truncated header");
    }
  } else {
    return FileError(
        absl::StatusCode::kInvalidArgument, path,
        absl::StrCat("unsupported .npy format version ", major, ".", minor));
  }
  const uint32_t header_size = LittleEndian(preamble + 8, length_size);
  const std::optional<uint64_t> header_left = BytesLeft(file.get());
  if (header_left.has_value() && header_size > *header_left) {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     "truncated header");
  }
  std::string header_text(header_size, '\0');
  if (std::fread(header_text.data(), 1, header_size, file.get()) !=
      header_size) {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     "truncated header");
  }
  absl::StatusOr<NpyHeader> header = HeaderParser(header_text).Parse();
  if (!header.ok()) {
    return FileError(header.status().code(), path, header.status().message());
  }
  if (header->fortran_order) {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     "Fortran-order arrays are not supported; save the array "
                     "in C order (numpy.ascontiguousarray)");
  }
  DType dtype;
  if (header->descr == "<f4") {
    dtype = DType::kFloat32;
  } else if (header->descr == "<f2") {
    dtype = DType::kFloat16;
  } else {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     absl::StrCat("unsupported dtype '", header->descr,
                                  "': expected little-endian float32 ('<f4') "
                                  "or float16 ('<f2')"));
  }
  const int64_t element_size = DTypeSize(dtype);
  absl::StatusOr<int64_t> count = ElementCount(header->shape, element_size);
  if (!count.ok()) {
    return FileError(count.status().code(), path, count.status().message());
  }

  const size_t data_bytes = *count * element_size;
  const std::optional<uint64_t> data_left = BytesLeft(file.get());
  if (data_left.has_value() && data_bytes > *data_left) {
    return FileError(
        absl::StatusCode::kInvalidArgument, path,
        absl::StrCat("truncated data: the header promises ", data_bytes,
                     " bytes, the file holds ", *data_left));
  }

  NpyArray array;
  array.shape = std::move(header->shape);
  array.values.resize(*count);
  std::vector<uint16_t> narrow(dtype == DType::kFloat32 ? 0 : *count);
  void* data = dtype == DType::kFloat32
                   ? static_cast<void*>(array.values.data())
                   : static_cast<void*>(narrow.data());
  const size_t read = std::fread(data, 1, data_bytes, file.get());
  if (read != data_bytes) {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     absl::StrCat("truncated data: the header promises ",
                                  data_bytes, " bytes, the file holds ", read));
  }
  if (std::fgetc(file.get()) != EOF) {
    return FileError(absl::StatusCode::kInvalidArgument, path,
                     absl::StrCat("the file holds more than the ", data_bytes,
                                  " data bytes its header promises"));
  }
  if (dtype != DType::kFloat32) {
    ConvertToFloat(dtype, narrow.data(), array.values.data(), *count);
  }
  return array;
}

absl::Status WriteNpy(const std::string& path, absl::Span<const int64_t> shape,
                      absl::Span<const float> values) {
  absl::StatusOr<int64_t> count = ElementCount(shape, sizeof(float));
  if (!count.ok()) {
    return FileError(count.status().code(), path, count.status().message());
  }
  if (*count != static_cast<int64_t>(values.size())) {
    return FileError(
        absl::StatusCode::kInvalidArgument, path,
        absl::StrCat("shape (", absl::StrJoin(shape, ", "), ") holds ", *count,
                     " values, got ", values.size()));
  }
  std::string dict = absl::StrCat(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (",
      absl::StrJoin(shape, ", "), shape.size() == 1 ? ",), }" : "), }");
  // Version 1.0 has a 2-byte header length; longer headers need 2.0.
  const bool wide = kPreambleSize + dict.size() + 1 > 0xffff;
  const size_t preamble_size = kPreambleSize + (wide ? 2 : 0);
  const size_t padded =
      (preamble_size + dict.size() + 1 + kHeaderAlignment - 1) /
      kHeaderAlignment * kHeaderAlignment;
  dict.resize(padded - preamble_size - 1, ' ');
  dict.push_back('\n');

  std::string preamble(kMagic);
  preamble.push_back(wide ? 2 : 1);
  preamble.push_back(0);
  for (size_t i = 0; i < preamble_size - 8; ++i) {
    preamble.push_back(static_cast<char>(dict.size() >> (8 * i) & 0xff));
  }

  File file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) {
    return FileError(absl::StatusCode::kInternal, path,
                     absl::StrCat("cannot create: ", std::strerror(errno)));
  }
  const bool written =
      std::fwrite(preamble.data(), 1, preamble.size(), file.get()) ==
          preamble.size() &&
      std::fwrite(dict.data(), 1, dict.size(), file.get()) == dict.size() &&
      std::fwrite(values.data(), sizeof(float), values.size(), file.get()) ==
          values.size();
  const int error = errno;
  if (std::fclose(file.release()) != 0 || !written) {
    return FileError(
        absl::StatusCode::kInternal, path,
        absl::StrCat("write failed: ", std::strerror(written ? errno : error)));
  }
  return absl::OkStatus();
}

}  // namespace ringattn
