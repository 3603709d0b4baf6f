#include "client/flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ringattn {
namespace {

absl::StatusOr<Flags> Parse(const std::vector<std::string>& args) {
  return Flags::Parse(args, {"target", "scale", "workers"}, {"causal"});
}

TEST(FlagsTest, ParsesBothSpellingsAndSwitches) {
  absl::StatusOr<Flags> flags =
      Parse({"--target", "host:1", "--scale=-0.5", "--causal"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_EQ(flags->Get("target"), "host:1");
  EXPECT_EQ(*flags->GetDouble("scale", 1.0), -0.5);
  EXPECT_TRUE(flags->GetSwitch("causal"));
  EXPECT_TRUE(flags->Has("causal"));
  EXPECT_FALSE(flags->Has("workers"));
  EXPECT_EQ(*flags->GetInt("workers", 3), 3);
  EXPECT_EQ(flags->Get("workers"), std::nullopt);
}

TEST(FlagsTest, SwitchTakesTrueOrFalse) {
  EXPECT_FALSE(Parse({"--causal=false"})->GetSwitch("causal"));
  EXPECT_TRUE(Parse({"--causal=true"})->GetSwitch("causal"));
  EXPECT_EQ(Parse({"--causal=yes"}).status().message(),
            "flag --causal takes no value or true/false, got 'yes'");
}

TEST(FlagsTest, RejectsWhatItDoesNotKnow) {
  EXPECT_EQ(Parse({"--bogus", "1"}).status().message(), "unknown flag --bogus");
  EXPECT_EQ(Parse({"stray"}).status().message(), "unexpected argument 'stray'");
  EXPECT_EQ(Parse({"--target"}).status().message(),
            "flag --target needs a value");
  EXPECT_EQ(Parse({"--target", "--causal"}).status().message(),
            "flag --target needs a value");
  EXPECT_EQ(Parse({"--workers=1", "--workers=2"}).status().message(),
            "flag --workers is given twice");
  for (const char* arg : {"--bogus", "stray", "--target"}) {
    EXPECT_EQ(Parse({arg}).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(FlagsTest, ReportsBadNumbersAndMissingFlags) {
  absl::StatusOr<Flags> flags = Parse({"--workers", "two", "--scale", "x"});
  ASSERT_TRUE(flags.ok());
  EXPECT_EQ(flags->GetInt("workers", 0).status().message(),
            "flag --workers takes an integer, got 'two'");
  EXPECT_EQ(flags->GetDouble("scale", 0).status().message(),
            "flag --scale takes a number, got 'x'");
  EXPECT_EQ(flags->Require("target").status().message(),
            "flag --target is required");
}

}  // namespace
}  // namespace ringattn
