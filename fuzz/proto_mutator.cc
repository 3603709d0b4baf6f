#include "fuzz/proto_mutator.h"

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace ringattn {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A field of some message inside the one being mutated.
struct FieldRef {
  Message* message;
  const FieldDescriptor* field;
};

// Every field of `message` and of the sub-messages it holds.
void CollectFields(Message* message, std::vector<FieldRef>* fields) {
  const Reflection* reflection = message->GetReflection();
  const auto* descriptor = message->GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    fields->push_back({message, field});
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int j = 0; j < reflection->FieldSize(*message, field); ++j) {
        CollectFields(reflection->MutableRepeatedMessage(message, field, j),
                      fields);
      }
    } else if (reflection->HasField(*message, field)) {
      CollectFields(reflection->MutableMessage(message, field), fields);
    }
  }
}

class Mutator {
 public:
  explicit Mutator(unsigned int seed) : random_(seed) {}

  void Mutate(Message* message) {
    std::vector<FieldRef> fields;
    CollectFields(message, &fields);
    const FieldRef& ref = fields[Below(fields.size())];
    const Reflection* reflection = ref.message->GetReflection();
    const FieldDescriptor* field = ref.field;
    if (!field->is_repeated()) {
      MutateSingle(ref.message, field);
      return;
    }
    const int count = reflection->FieldSize(*ref.message, field);
    if (count > 0 && Below(3) == 0) {
      reflection->RemoveLast(ref.message, field);
    } else if (count == 0 || Below(2) == 0) {
      AddElement(ref.message, field);
    } else {
      MutateElement(ref.message, field, static_cast<int>(Below(count)));
    }
  }

 private:
  size_t Below(size_t n) { return random_() % n; }

  // Values at the edges of the integer types, or small ones, or any.
  int64_t Integer(int64_t current) {
    static const int64_t kEdges[] = {0,
                                     1,
                                     -1,
                                     2,
                                     std::numeric_limits<int32_t>::max(),
                                     int64_t{1} << 32,
                                     int64_t{1} << 56,
                                     int64_t{1} << 62,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
    switch (Below(4)) {
      case 0:
        return kEdges[Below(sizeof(kEdges) / sizeof(kEdges[0]))];
      case 1:
        // Wraps around at the limits rather than overflowing.
        return static_cast<int64_t>(static_cast<uint64_t>(current) + Below(9) -
                                    4);
      case 2:
        return static_cast<int64_t>(Below(64));
      default:
        return static_cast<int64_t>(random_());
    }
  }

  float Float() {
    static const float kEdges[] = {0.0f,
                                   -1.0f,
                                   1.0f,
                                   1e-45f,
                                   3e38f,
                                   std::numeric_limits<float>::infinity(),
                                   std::numeric_limits<float>::quiet_NaN()};
    return kEdges[Below(sizeof(kEdges) / sizeof(kEdges[0]))];
  }

  std::string Bytes(std::string value) {
    if (Below(2) == 0) {
      value.resize(Below(2 * value.size() + 16), '\x3c');
      return value;
    }
    const size_t size = value.size();
    value.resize(2 * size + 16);
    value.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(value.data()),
                                  size, value.size()));
    return value;
  }

  void MutateSingle(Message* message, const FieldDescriptor* field) {
    const Reflection* r = message->GetReflection();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(
            message, field,
            static_cast<int32_t>(Integer(r->GetInt32(*message, field))));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(message, field, Integer(r->GetInt64(*message, field)));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(message, field, static_cast<uint32_t>(Integer(0)));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(message, field, static_cast<uint64_t>(Integer(0)));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(message, field, Float());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(message, field, Float());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(message, field, !r->GetBool(*message, field));
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnumValue(message, field, static_cast<int>(Below(6)) - 1);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(message, field, Bytes(r->GetString(*message, field)));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (r->HasField(*message, field) && Below(4) == 0) {
          r->ClearField(message, field);
        } else {
          r->MutableMessage(message, field);  // sets it, with defaults
        }
        break;
    }
  }

  void AddElement(Message* message, const FieldDescriptor* field) {
    const Reflection* r = message->GetReflection();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT64:
        r->AddInt64(message, field, Integer(0));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        r->AddMessage(message, field);
        break;
      default:
        break;  // the protos fuzzed here repeat only these
    }
  }

  void MutateElement(Message* message, const FieldDescriptor* field,
                     int index) {
    const Reflection* r = message->GetReflection();
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
      r->SetRepeatedInt64(message, field, index,
                          Integer(r->GetRepeatedInt64(*message, field, index)));
    }
  }

  std::minstd_rand random_;
};

}  // namespace

size_t MutateProtoSequence(const Message& prototype, size_t param_bytes,
                           uint8_t* data, size_t size, size_t max_size,
                           unsigned int seed) {
  std::minstd_rand random(seed);
  std::vector<std::unique_ptr<Message>> messages;
  FuzzInput input(data, size);
  std::string params;
  for (size_t i = 0; i < param_bytes && i < size; ++i) {
    params.push_back(static_cast<char>(input.TakeByte()));
  }
  while (true) {
    std::unique_ptr<Message> message(prototype.New());
    if (!input.Next(message.get())) break;
    messages.push_back(std::move(message));
  }
  if (messages.empty() || random() % 4 == 0) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  Mutator mutator(static_cast<unsigned int>(random()));
  const size_t pick = random() % (messages.size() + 1);
  if (pick == messages.size()) {
    // A new message: a copy of another, mutated.
    messages.push_back(std::unique_ptr<Message>(prototype.New()));
    messages.back()->CopyFrom(*messages[random() % (messages.size() - 1)]);
  }
  mutator.Mutate(messages[pick].get());
  std::string out = params;
  for (const auto& message : messages) AppendMessage(*message, &out);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace ringattn
