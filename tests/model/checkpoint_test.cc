// Tests of kvpage/checkpoint.h: weight bytes from safetensors headers written by the test.
#include "kvpage/checkpoint.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvpage {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// A fresh, empty directory under the test's temp dir.
std::filesystem::path FreshDir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Writes a safetensors file: the 8-byte little-endian length of `header`, `header`, then
// `data_bytes` zero bytes of tensor data.
void WriteSafetensors(const std::filesystem::path& path, const std::string& header,
                      int64_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(static_cast<size_t>(data_bytes), '\0');
}

void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Error status of reading a single-file checkpoint whose header is `header`.
absl::Status SingleFileError(const std::string& header, int64_t data_bytes) {
  const auto dir = FreshDir("kvpage_checkpoint_bad");
  WriteSafetensors(dir / "model.safetensors", header, data_bytes);
  return ReadCheckpointWeights(dir.string()).status();
}

TEST(CheckpointTest, SingleFileSumsEveryTensorsBytes) {
  const auto dir = FreshDir("kvpage_checkpoint_single");
  // bf16 [4, 8] = 32 × 2 = 64 B at 0..64; f32 [3] = 12 B at 64..76. Metadata is not a tensor.
  WriteSafetensors(dir / "model.safetensors",
                   R"({"__metadata__":{"format":"pt"},)"
                   R"("w":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},)"
                   R"("b":{"dtype":"F32","shape":[3],"data_offsets":[64,76]}})",
                   76);
  const absl::StatusOr<CheckpointWeights> w = ReadCheckpointWeights(dir.string());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->total_bytes, 76);
  EXPECT_EQ(w->num_tensors, 2);
  EXPECT_EQ(w->num_files, 1);
  EXPECT_THAT(w->bytes_by_dtype, UnorderedElementsAre(Pair("BF16", 64), Pair("F32", 12)));
}

TEST(CheckpointTest, ShardedIndexCountsQuantizedAndSubByteTensors) {
  const auto dir = FreshDir("kvpage_checkpoint_sharded");
  // Shard 1: MXFP4-style u8 blocks [16, 8] = 128 B, their e8m0 scales [16] = 16 B,
  // an fp8 weight [4, 4] = 16 B: 160 B.
  WriteSafetensors(dir / "model-00001-of-00002.safetensors",
                   R"({"experts.blocks":{"dtype":"U8","shape":[16,8],"data_offsets":[0,128]},)"
                   R"("experts.scales":{"dtype":"F8_E8M0","shape":[16],"data_offsets":[128,144]},)"
                   R"("q.weight":{"dtype":"F8_E4M3","shape":[4,4],"data_offsets":[144,160]}})",
                   160);
  // Shard 2: bf16 [10] = 20 B, then F4 [5] = ceil(5 × 4 / 8) = 3 B: 23 B.
  WriteSafetensors(dir / "model-00002-of-00002.safetensors",
                   R"({"norm":{"dtype":"BF16","shape":[10],"data_offsets":[0,20]},)"
                   R"("tiny":{"dtype":"F4","shape":[5],"data_offsets":[20,23]}})",
                   23);
  WriteText(dir / "model.safetensors.index.json",
            R"({"metadata":{"total_size":183},"weight_map":{)"
            R"("experts.blocks":"model-00001-of-00002.safetensors",)"
            R"("experts.scales":"model-00001-of-00002.safetensors",)"
            R"("q.weight":"model-00001-of-00002.safetensors",)"
            R"("norm":"model-00002-of-00002.safetensors",)"
            R"("tiny":"model-00002-of-00002.safetensors"}})");
  const absl::StatusOr<CheckpointWeights> w = ReadCheckpointWeights(dir.string());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->total_bytes, 160 + 23);
  EXPECT_EQ(w->num_tensors, 5);
  EXPECT_EQ(w->num_files, 2);
  EXPECT_THAT(w->bytes_by_dtype,
              UnorderedElementsAre(Pair("U8", 128), Pair("F8_E8M0", 16), Pair("F8_E4M3", 16),
                                   Pair("BF16", 20), Pair("F4", 3)));
}

TEST(CheckpointTest, MissingFilesAreNotFoundSoTheCallerCanFallBack) {
  EXPECT_TRUE(absl::IsNotFound(
      ReadCheckpointWeights((FreshDir("kvpage_checkpoint_empty") / "absent").string()).status()));
  const absl::Status empty = ReadCheckpointWeights(FreshDir("kvpage_checkpoint_empty").string())
                                 .status();
  EXPECT_TRUE(absl::IsNotFound(empty));
  EXPECT_THAT(empty.message(), HasSubstr("model.safetensors.index.json"));
}

TEST(CheckpointTest, MalformedHeadersNameTheTensorAndField) {
  struct Case {
    std::string header;
    int64_t data_bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2, "unknown dtype 'Q4_K'"},
      {R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,6]}})", 6,
       "tensor 'w': holds 6 bytes but its shape [4] of BF16 needs 8"},
      {R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3,
       "leaves a gap after the previous tensor, which ends at 0"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
       4, "overlaps the previous tensor"},
      {R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5,
       "the tensors cover 2 bytes of a 5-byte data section"},
      {R"({"w":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2,
       "shape[0] must be a non-negative integer, got -2"},
      {R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}})", 2, "end 0 < begin 2"},
      {R"({"w":{"dtype":"U8","shape":[2]}})", 2, "data_offsets must be [begin, end]"},
      {R"(["not", "an", "object"])", 0, "the header is not a JSON object"},
  };
  for (const Case& c : cases) {
    const absl::Status s = SingleFileError(c.header, c.data_bytes);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.header << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.header;
  }
}

TEST(CheckpointTest, HeaderLengthPastTheFileIsRefused) {
  const auto dir = FreshDir("kvpage_checkpoint_short");
  std::ofstream(dir / "model.safetensors", std::ios::binary) << std::string("\xff\x00\x00\x00"
                                                                            "\x00\x00\x00\x00{}",
                                                                            10);
  const absl::Status s = ReadCheckpointWeights(dir.string()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("header length 255 exceeds the file (10 bytes)"));
  std::ofstream(dir / "model.safetensors", std::ios::binary) << "abc";
  EXPECT_THAT(ReadCheckpointWeights(dir.string()).status().message(),
              HasSubstr("3 bytes, shorter than the 8-byte header length"));
}

TEST(CheckpointTest, IndexMustNameFilesThatHoldItsTensors) {
  const auto dir = FreshDir("kvpage_checkpoint_index");
  WriteSafetensors(dir / "a.safetensors",
                   R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  auto error = [&](const std::string& index) {
    WriteText(dir / "model.safetensors.index.json", index);
    return ReadCheckpointWeights(dir.string()).status();
  };
  EXPECT_THAT(error(R"({"weight_map":{"y":"a.safetensors"}})").message(),
              HasSubstr("tensor 'y' is mapped to a.safetensors, which lacks it"));
  EXPECT_THAT(error(R"({"weight_map":{"x":"b.safetensors"}})").message(),
              HasSubstr("names b.safetensors, which cannot be read"));
  EXPECT_THAT(error(R"({"weight_map":{"x":"../a.safetensors"}})").message(),
              HasSubstr("is not a file of the checkpoint"));
  EXPECT_THAT(error(R"({"weight_map":{}})").message(), HasSubstr("weight_map must be"));
  EXPECT_THAT(error("{").message(), HasSubstr("not a JSON object"));
  WriteText(dir / "model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors"}})");
  const absl::StatusOr<CheckpointWeights> ok = ReadCheckpointWeights(dir.string());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->total_bytes, 1);
}

}  // namespace
}  // namespace kvpage
