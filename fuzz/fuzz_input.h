#ifndef RINGATTN_FUZZ_FUZZ_INPUT_H_
#define RINGATTN_FUZZ_FUZZ_INPUT_H_

// The byte format the fuzz targets share: a few parameter bytes, then a
// sequence of serialized protos, each after its length as two little-endian
// bytes. FuzzInput reads it; AppendMessage writes it (for the seed corpus).

#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/message_lite.h"

namespace ringattn {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next byte; 0 once the input is used up.
  uint8_t TakeByte() { return pos_ < size_ ? data_[pos_++] : 0; }

  // Parses the next message into `message`. False at the end of the input
  // or where the bytes do not parse (a stream that broke off).
  bool Next(google::protobuf::MessageLite* message) {
    if (size_ - pos_ < 2) return false;
    const size_t length = data_[pos_] | data_[pos_ + 1] << 8;
    pos_ += 2;
    if (length > size_ - pos_) return false;
    const bool parsed = message->ParseFromArray(data_ + pos_, length);
    pos_ += length;
    return parsed;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends `message` to `out` in the form FuzzInput::Next reads.
inline void AppendMessage(const google::protobuf::MessageLite& message,
                          std::string* out) {
  const std::string bytes = message.SerializeAsString();
  out->push_back(static_cast<char>(bytes.size() & 0xff));
  out->push_back(static_cast<char>(bytes.size() >> 8 & 0xff));
  out->append(bytes);
}

}  // namespace ringattn

#endif  // RINGATTN_FUZZ_FUZZ_INPUT_H_
