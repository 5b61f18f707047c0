// ridgeserve-cli's argument helpers: repeatable --stop, escapes, id lists, prompt sources.
#include "client/cli_parsing.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

using ::testing::ElementsAre;

TEST(CliParsingTest, CollectsEveryStopFlag) {
  const char* args[] = {"cli", "generate",   "--stop", "a",      "--stop=b,c", "-stop",
                        "d",   "--stopx=no", "--",     "--stop", "e"};
  std::vector<char*> argv;
  for (const char* a : args) argv.push_back(const_cast<char*>(a));
  EXPECT_THAT(CollectRepeatedFlag(static_cast<int>(argv.size()), argv.data(), "stop"),
              ElementsAre("a", "b,c", "d"));
}

TEST(CliParsingTest, StopListSplitsAndUnescapes) {
  auto stops = ParseStopList("a,b\\,c,\\n\\n,x\\ty");
  ASSERT_TRUE(stops.ok()) << stops.status();
  EXPECT_THAT(*stops, ElementsAre("a", "b,c", "\n\n", "x\ty"));
  EXPECT_FALSE(ParseStopList("a,,b").ok());
  EXPECT_FALSE(ParseStopList("\\q").ok());
}

TEST(CliParsingTest, IdLists) {
  auto ids = ParseIdList("token_ids", "1, 2,3");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(*ids, ElementsAre(1, 2, 3));
  EXPECT_TRUE(ParseIdList("token_ids", "")->empty());
  EXPECT_EQ(ParseIdList("token_ids", "1,x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CliParsingTest, PrefillModes) {
  EXPECT_EQ(*ParsePrefillMode("exact"), v1::PrefillOptions::EXACT);
  EXPECT_EQ(*ParsePrefillMode("RidgeFill"), v1::PrefillOptions::RIDGEFILL);
  EXPECT_EQ(*ParsePrefillMode("spec_pc"), v1::PrefillOptions::SPEC_PC);
  EXPECT_EQ(*ParsePrefillMode("spec_kv"), v1::PrefillOptions::SPEC_KV);
  EXPECT_FALSE(ParsePrefillMode("fast").ok());
}

TEST(CliParsingTest, PromptSources) {
  EXPECT_EQ(*ReadPrompt({"What", "is", "it?"}, "", ""), "What is it?");
  EXPECT_EQ(*ReadPrompt({}, "flag prompt", ""), "flag prompt");
  const std::string path =
      (std::filesystem::temp_directory_path() / "ridgeserve_cli_prompt.txt").string();
  {
    std::ofstream out(path);
    out << "from a file\n";
  }
  EXPECT_EQ(*ReadPrompt({}, "", path), "from a file\n");
  std::remove(path.c_str());
  EXPECT_EQ(ReadPrompt({}, "", path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadPrompt({"a"}, "b", "").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ridgeserve
