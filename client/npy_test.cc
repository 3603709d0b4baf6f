#include "client/npy.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), bytes.size());
}

// A .npy file of format `major`.0 holding header text `dict` and then `data`.
std::string NpyBytes(int major, const std::string& dict,
                     const std::string& data) {
  std::string bytes("\x93NUMPY", 6);
  bytes.push_back(static_cast<char>(major));
  bytes.push_back(0);
  const int length_size = major == 1 ? 2 : 4;
  for (int i = 0; i < length_size; ++i) {
    bytes.push_back(static_cast<char>(dict.size() >> (8 * i) & 0xff));
  }
  return bytes + dict + data;
}

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

std::string HalfBytes(const std::vector<uint16_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(uint16_t));
}

// Reading `bytes` (written to a file) fails with INVALID_ARGUMENT and a
// message naming the file and containing `problem`.
void ExpectInvalid(const std::string& name, const std::string& bytes,
                   const std::string& problem) {
  const std::string path = TempPath(name);
  WriteFile(path, bytes);
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  ASSERT_FALSE(array.ok()) << name;
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(array.status().message().find(path), std::string::npos)
      << array.status();
  EXPECT_NE(array.status().message().find(problem), std::string::npos)
      << array.status();
}

TEST(NpyTest, RoundTripsShapesOfAnyRank) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 4}, {5}, {}, {0, 3}, {1, 2, 3, 4, 2}};
  for (const std::vector<int64_t>& shape : shapes) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    std::vector<float> values(count);
    for (int64_t i = 0; i < count; ++i) values[i] = 0.25f * i - 3.0f;
    const std::string path = TempPath("round_trip.npy");
    ASSERT_TRUE(WriteNpy(path, shape, values).ok());
    absl::StatusOr<NpyArray> array = ReadNpy(path);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->shape, shape);
    EXPECT_EQ(array->values, values);
  }
}

TEST(NpyTest, WritesNumpysLayout) {
  const std::string path = TempPath("layout.npy");
  ASSERT_TRUE(WriteNpy(path, {2, 1}, {1.0f, -2.0f}).ok());
  const std::string bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_size =
      static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  EXPECT_EQ((10 + header_size) % 64, 0u);
  const std::string dict = bytes.substr(10, header_size);
  EXPECT_EQ(dict.find("{'descr': '<f4', 'fortran_order': False, "
                      "'shape': (2, 1), }"),
            0u);
  EXPECT_EQ(dict.back(), '\n');
  EXPECT_EQ(bytes.substr(10 + header_size), FloatBytes({1.0f, -2.0f}));

  ASSERT_TRUE(WriteNpy(path, {3}, {1, 2, 3}).ok());
  EXPECT_NE(ReadFile(path).find("'shape': (3,)"), std::string::npos);
}

TEST(NpyTest, WritesVersion2WhenTheHeaderIsLong) {
  const std::vector<int64_t> shape(25000, 1);
  const std::string path = TempPath("long_header.npy");
  ASSERT_TRUE(WriteNpy(path, shape, {7.0f}).ok());
  const std::string bytes = ReadFile(path);
  EXPECT_EQ(bytes[6], 2);
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->shape, shape);
  EXPECT_EQ(array->values, std::vector<float>{7.0f});
}

TEST(NpyTest, ReadsFloat16AndWidensIt) {
  // 1.0, -2.0, 0.5, 65504 (the largest fp16), a subnormal (2^-24).
  const std::string path = TempPath("half.npy");
  WriteFile(path,
            NpyBytes(1,
                     "{'descr': '<f2', 'fortran_order': False, "
                     "'shape': (5,), }\n",
                     HalfBytes({0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001})));
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->shape, std::vector<int64_t>{5});
  EXPECT_EQ(array->values, (std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f,
                                               5.9604644775390625e-08f}));
}

TEST(NpyTest, ReadsVersions2And3AndOtherSpellings) {
  const std::string data = FloatBytes({1, 2, 3, 4, 5, 6});
  for (int major : {2, 3}) {
    const std::string path = TempPath("v23.npy");
    // Keys in another order, double quotes, Python 2 longs, no trailing comma.
    WriteFile(path, NpyBytes(major,
                             "{\"shape\": (2L, 3L), \"fortran_order\": False, "
                             "\"descr\": \"<f4\"}   \n",
                             data));
    absl::StatusOr<NpyArray> array = ReadNpy(path);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(array->values, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(NpyTest, MissingFileIsNotFound) {
  const std::string path = TempPath("does_not_exist.npy");
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(array.status().message().find(path), std::string::npos);
}

TEST(NpyTest, RejectsBadFiles) {
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, ";
  const std::string two = FloatBytes({1, 2});
  ExpectInvalid("magic.npy", "PK\x03\x04 not numpy at all", "bad magic");
  ExpectInvalid("short.npy", "\x93NUM", "bad magic");
  ExpectInvalid("version.npy", NpyBytes(4, f4 + "'shape': (2,), }", two),
                "format version 4.0");
  ExpectInvalid("header.npy", std::string("\x93NUMPY\x01\x00\x50\x00{'de", 14),
                "truncated header");
  ExpectInvalid("truncated.npy", NpyBytes(1, f4 + "'shape': (3,), }", two),
                "truncated data: the header promises 12 bytes, the file "
                "holds 8");
  ExpectInvalid("trailing.npy", NpyBytes(1, f4 + "'shape': (1,), }", two),
                "more than the 4 data bytes");
  ExpectInvalid("f8.npy",
                NpyBytes(1,
                         "{'descr': '<f8', 'fortran_order': False, "
                         "'shape': (1,), }",
                         two),
                "unsupported dtype '<f8'");
  ExpectInvalid("big_endian.npy",
                NpyBytes(1,
                         "{'descr': '>f4', 'fortran_order': False, "
                         "'shape': (2,), }",
                         two),
                "unsupported dtype '>f4'");
  ExpectInvalid("structured.npy",
                NpyBytes(1,
                         "{'descr': [('a', '<f4')], 'fortran_order': False, "
                         "'shape': (2,), }",
                         two),
                "structured arrays");
  ExpectInvalid("fortran.npy",
                NpyBytes(1,
                         "{'descr': '<f4', 'fortran_order': True, "
                         "'shape': (2, 1), }",
                         two),
                "Fortran-order");
  ExpectInvalid("no_shape.npy",
                NpyBytes(1, "{'descr': '<f4', 'fortran_order': False}", two),
                "are required");
  ExpectInvalid("bad_shape.npy", NpyBytes(1, f4 + "'shape': (-2,), }", two),
                "non-negative integers");
  ExpectInvalid("huge.npy",
                NpyBytes(1, f4 + "'shape': (4294967296, 4294967296), }", two),
                "too large");
  ExpectInvalid("extra_key.npy",
                NpyBytes(1, f4 + "'shape': (2,), 'x': 1}", two),
                "unexpected key 'x'");
}

// The process's peak resident memory in KiB.
long PeakRssKib() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// Found by fuzz/npy_fuzzer: a 100-byte file whose header claimed a 1.9 GB
// header (or a shape of terabytes) made the reader allocate that much before
// it noticed the file was short.
TEST(NpyTest, RefusesSizesLargerThanTheFileBeforeAllocating) {
  const long peak_before = PeakRssKib();
  std::string huge_header("\x93NUMPY\x03\x00\x74\x00\x00\x73", 12);
  huge_header += "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
  ExpectInvalid("huge_header.npy", huge_header, "truncated header");
  ExpectInvalid("huge_data.npy",
                NpyBytes(1,
                         "{'descr': '<f2', 'fortran_order': False, "
                         "'shape': (1099511627776,), }",
                         FloatBytes({1, 2})),
                "the header promises 2199023255552 bytes, the file holds 8");
  EXPECT_LT(PeakRssKib() - peak_before, 64 * 1024);
}

TEST(NpyTest, WriteRejectsAShapeThatDoesNotMatchTheValues) {
  const absl::Status status = WriteNpy(TempPath("mismatch.npy"), {2, 2}, {1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("holds 4 values, got 1"), std::string::npos)
      << status;
}

TEST(NpyTest, WriteReportsAnUnwritablePath) {
  const absl::Status status =
      WriteNpy(TempPath("no_such_dir/out.npy"), {1}, {1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("no_such_dir/out.npy"), std::string::npos);
}

}  // namespace
}  // namespace ringattn
