// The streaming trace readers: rows are parsed from the input as it is read, and a row keeps
// what its request needs, whatever the row claims.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "sim/random.h"
#include "sim/trace.h"
#include "sim/trace_readers.h"

namespace kvpage::sim {
namespace {

using ::testing::HasSubstr;

const std::string kTraces = std::string(KVPAGE_SOURCE_DIR) + "/sim/data/traces/";

// Every field of every request folded into one value: splitmix64 chained over the index, the
// arrival's bits, the lengths, the segment count and each segment's key and length.
uint64_t Checksum(const std::vector<TraceRequest>& trace) {
  uint64_t h = 0;
  const auto mix = [&h](uint64_t x) { h = SplitMix64Finalize(h ^ x); };
  for (const TraceRequest& r : trace) {
    uint64_t arrival_bits = 0;
    std::memcpy(&arrival_bits, &r.arrival_s, sizeof arrival_bits);
    mix(static_cast<uint64_t>(r.index));
    mix(arrival_bits);
    mix(static_cast<uint64_t>(r.prompt_len));
    mix(static_cast<uint64_t>(r.output_len));
    mix(r.segments.size());
    for (const PromptSegment& s : r.segments) {
      mix(s.key);
      mix(static_cast<uint64_t>(s.length));
    }
  }
  return h;
}

// The expected checksums come from an independent reading of the files in Python (json.loads
// per line, the segment rules of trace.h, the same fold), not from the C++ readers: 12,031
// and 3,993 requests, seed 7. The streaming reader gives what the whole-file reader gave.
TEST(MooncakeReaderTest, BundledTracesReadAsAnIndependentReadingDoes) {
  TraceOptions o;
  o.seed = 7;
  auto conversation =
      ReadTrace(TraceFormat::kMooncake, kTraces + "mooncake_conversation_trace.jsonl", o);
  ASSERT_TRUE(conversation.ok()) << conversation.status();
  EXPECT_EQ(conversation->size(), 12031u);
  EXPECT_EQ(Checksum(*conversation), 0x526e873acecc3668ULL);
  auto synthetic = ReadTrace(TraceFormat::kMooncake, kTraces + "mooncake_synthetic_trace.jsonl", o);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  EXPECT_EQ(synthetic->size(), 3993u);
  EXPECT_EQ(Checksum(*synthetic), 0xbda2231032efae22ULL);
}

std::string Row(absl::string_view ids, int64_t input_length = 1536,
                int64_t output_length = 2) {
  return absl::StrCat(R"({"timestamp": 1, "input_length": )", input_length,
                      R"(, "output_length": )", output_length, R"(, "hash_ids": )", ids, "}");
}

// A row that claims 2^31 - 1 outputs is read as it is (the simulator sizes nothing by it), and
// a million ids for a 1,537-token prompt keep four blocks.
TEST(MooncakeReaderTest, LongIdListsKeepTheBlocksThePromptCovers) {
  std::string ids = "[";
  for (int i = 0; i < 1000000; ++i) absl::StrAppend(&ids, i == 0 ? "" : ", ", i + 10);
  ids += "]";
  auto trace = ParseTrace(TraceFormat::kMooncake, Row(ids, 1537, 2147483647), "t.txt", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  const TraceRequest& r = (*trace)[0];
  EXPECT_EQ(r.prompt_len, 1537);
  EXPECT_EQ(r.output_len, 2147483647);
  ASSERT_EQ(r.segments.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.segments[i].key, StreamKey(0, StreamKind::kMooncakeBlock, i + 10));
    EXPECT_EQ(r.segments[i].length, i < 3 ? 512 : 1);
  }
}

// A prompt of 2^31 - 1 tokens uses kMaxMooncakeHashIds (4,194,304) ids, the last covering 511
// tokens; the two ids past them are read and dropped.
TEST(MooncakeReaderTest, TheLongestPromptKeepsAtMostItsIds) {
  std::string ids = "[";
  for (int64_t i = 0; i < kMaxMooncakeHashIds + 2; ++i) ids += i == 0 ? "1" : ",1";
  ids += "]";
  auto trace = ParseTrace(TraceFormat::kMooncake, Row(ids, 2147483647), "t.txt", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  const TraceRequest& r = (*trace)[0];
  ASSERT_EQ(static_cast<int64_t>(r.segments.size()), kMaxMooncakeHashIds);
  EXPECT_EQ(r.segments.back().length, 511);
  EXPECT_EQ(r.segments.back().key, StreamKey(0, StreamKind::kMooncakeBlock, 1));
}

// Ids are taken past the JSON parser while each is a plain integer followed by a comma and
// another; everything else goes to the parser, which must say what it said of the whole row.
TEST(MooncakeReaderTest, IdListsThatAreNotJsonGetTheParsersMessage) {
  for (const char* ids : {"[1, 2, ]", "[1, 2 3]", "[1, 2, 3", "[1, 01, 2]", "[1,2,3,,4]",
                          "[1, 2, 3]] ", "[1, 2, 3e]"}) {
    const std::string row = Row(ids);
    std::string expected;
    try {
      const nlohmann::json parsed = nlohmann::json::parse(row);
      (void)parsed;
    } catch (const nlohmann::json::parse_error& e) {
      expected = e.what();
      expected = expected.substr(expected.find("] ") + 2);  // as the reader words it
    }
    ASSERT_FALSE(expected.empty()) << row;
    const absl::Status st = ParseTrace(TraceFormat::kMooncake, row, "t.txt", {}).status();
    EXPECT_EQ(st.message(), absl::StrCat("t.txt:1: not valid JSON (", expected, ")")) << row;
  }
}

TEST(MooncakeReaderTest, BadIdsAfterPlainOnesAreNamed) {
  const struct {
    const char* ids;
    const char* named;
  } cases[] = {{"[1, 2, -3, 4]", "hash id -3 "},
               {"[1, 2, 18446744073709551616, 4]", "hash id 1.8446744073709552e+19 "},
               {"[1, 2, 3.0]", "hash id 3.0 "},
               {"[1, 2, [3, 4]]", "hash id [3,4] "},
               {R"([1, 2, "3"])", R"(hash id "3" )"}};
  for (const auto& c : cases) {
    const absl::Status st = ParseTrace(TraceFormat::kMooncake, Row(c.ids), "t.txt", {}).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.ids;
    EXPECT_THAT(st.message(), HasSubstr(c.named)) << c.ids;
  }
  // The largest id is plain.
  auto max_id = ParseTrace(TraceFormat::kMooncake, Row("[18446744073709551615, 0, 7]"), "t", {});
  ASSERT_TRUE(max_id.ok()) << max_id.status();
  EXPECT_EQ((*max_id)[0].segments[0].key,
            StreamKey(0, StreamKind::kMooncakeBlock, 18446744073709551615ULL));
}

TEST(MooncakeReaderTest, SpacingRepeatedKeysAndNulBytes) {
  auto spaced = ParseTrace(TraceFormat::kMooncake, "  " + Row("[ 7 ,8,\t9 , 10 ]", 2048) + " \r\n",
                           "t", {});
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  ASSERT_EQ((*spaced)[0].segments.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ((*spaced)[0].segments[i].key, StreamKey(0, StreamKind::kMooncakeBlock, i + 7));
  }
  // The last of a repeated key counts, as it did in a parsed document.
  auto repeated = ParseTrace(TraceFormat::kMooncake,
                             R"({"timestamp": 1, "input_length": 600, "output_length": 2, )"
                             R"("hash_ids": [1], "hash_ids": [2, 3], "timestamp": 2})",
                             "t", {});
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_DOUBLE_EQ((*repeated)[0].arrival_s, 0.002);
  ASSERT_EQ((*repeated)[0].segments.size(), 2u);
  EXPECT_EQ((*repeated)[0].segments[1].key, StreamKey(0, StreamKind::kMooncakeBlock, 3));
  // A NUL byte inside a list of ids, or after a syntax error, is named with its column.
  std::string nul = Row("[1, 2, 3]");
  nul[nul.size() - 3] = '\0';  // the '3'
  EXPECT_THAT(ParseTrace(TraceFormat::kMooncake, nul, "t", {}).status().message(),
              HasSubstr(absl::StrCat("t:1: NUL byte at column ", nul.size() - 2)));
  std::string late = Row("[1, x, 3]");
  late[late.size() - 3] = '\0';
  EXPECT_THAT(ParseTrace(TraceFormat::kMooncake, late, "t", {}).status().message(),
              HasSubstr(absl::StrCat("t:1: NUL byte at column ", late.size() - 2)));
}

// max_requests stops the reading: rows after it are not parsed, so their faults are not seen.
TEST(MooncakeReaderTest, RowsPastMaxRequestsAreNotRead) {
  const std::string text = Row("[1]") + "\n" + Row("[2]") + "\nnot json\n";
  TraceOptions o;
  o.max_requests = 2;
  auto trace = ParseTrace(TraceFormat::kMooncake, text, "t", o);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->size(), 2u);
  EXPECT_THAT(ParseTrace(TraceFormat::kMooncake, text, "t", {}).status().message(),
              HasSubstr("t:3: not valid JSON"));
}

// CSV rows are held one at a time, up to 1 MiB.
TEST(MooncakeReaderTest, CsvLinesLongerThanAMebibyteAreRefused) {
  const std::string text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10," +
                           std::string(size_t{2} << 20, '7') + "\n";
  EXPECT_EQ(ParseTrace(TraceFormat::kAzure, text, "t.csv", {}).status().message(),
            "t.csv:2: line longer than 1048576 bytes");
}

}  // namespace
}  // namespace kvpage::sim
