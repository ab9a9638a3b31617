#include "sim/trace.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvpage::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kTraces = std::string(KVPAGE_SOURCE_DIR) + "/sim/data/traces/";

std::vector<int32_t> Slice(const std::vector<int32_t>& v, size_t from, size_t len) {
  return std::vector<int32_t>(v.begin() + static_cast<std::ptrdiff_t>(from),
                              v.begin() + static_cast<std::ptrdiff_t>(from + len));
}

absl::Status ParseError(TraceFormat format, const std::string& text, TraceOptions options = {}) {
  return ParseTrace(format, text, "t.txt", options).status();
}

TEST(TraceFormatTest, NamesRoundTripAndUnknownIsAnError) {
  for (TraceFormat f : {TraceFormat::kMooncake, TraceFormat::kAzure, TraceFormat::kLengths}) {
    auto parsed = ParseTraceFormat(TraceFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_EQ(*ParseTraceFormat("MoonCake"), TraceFormat::kMooncake);
  absl::Status st = ParseTraceFormat("burstgpt").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("'burstgpt'"));
}

TEST(PromptTokensTest, StreamsAreDeterministicPrefixConsistentAndInVocab) {
  TraceRequest a;
  a.prompt_len = 600;
  a.vocab_size = 1000;
  a.segments = {{StreamKey(7, StreamKind::kMooncakeBlock, 3), 600}};
  TraceRequest b = a;
  b.prompt_len = 100;
  b.segments = {{StreamKey(7, StreamKind::kMooncakeBlock, 3), 100}};
  const std::vector<int32_t> ta = PromptTokens(a), tb = PromptTokens(b);
  ASSERT_EQ(ta.size(), 600u);
  EXPECT_EQ(Slice(ta, 0, 100), tb);
  for (int32_t t : ta) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 1000);
  }
  // Another seed, kind or id gives another stream.
  EXPECT_NE(StreamKey(7, StreamKind::kMooncakeBlock, 3), StreamKey(8, StreamKind::kMooncakeBlock, 3));
  EXPECT_NE(StreamKey(7, StreamKind::kMooncakeBlock, 3), StreamKey(7, StreamKind::kRequestUnique, 3));
  EXPECT_NE(StreamKey(7, StreamKind::kMooncakeBlock, 3), StreamKey(7, StreamKind::kMooncakeBlock, 4));
}

TEST(MooncakeTest, HashIdsBecomeSharedBlocksWithAPartialLastBlock) {
  const std::string text =
      R"({"timestamp": 0, "input_length": 1030, "output_length": 5, "hash_ids": [0, 1, 2]})"
      "\n\n"
      R"({"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 9]})"
      "\n";
  auto trace = ParseTrace(TraceFormat::kMooncake, text, "t.jsonl", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 2u);
  const TraceRequest& r0 = (*trace)[0];
  const TraceRequest& r1 = (*trace)[1];
  EXPECT_EQ(r0.index, 0);
  EXPECT_EQ(r1.index, 1);
  EXPECT_DOUBLE_EQ(r0.arrival_s, 0.0);
  EXPECT_DOUBLE_EQ(r1.arrival_s, 1.5);
  EXPECT_EQ(r0.prompt_len, 1030);
  EXPECT_EQ(r0.output_len, 5);
  ASSERT_EQ(r0.segments.size(), 3u);
  EXPECT_EQ(r0.segments[2].length, 1030 - 2 * 512);  // partial last block: 6 tokens
  EXPECT_EQ(r1.segments[1].length, 600 - 512);
  const std::vector<int32_t> t0 = PromptTokens(r0), t1 = PromptTokens(r1);
  ASSERT_EQ(t0.size(), 1030u);
  ASSERT_EQ(t1.size(), 600u);
  EXPECT_EQ(Slice(t0, 0, 512), Slice(t1, 0, 512));  // hash id 0 shared
  EXPECT_NE(Slice(t0, 512, 88), Slice(t1, 512, 88));  // ids 1 and 9 differ
}

TEST(MooncakeTest, RowsWhoseIdsDoNotMatchTheLengthAreNormalised) {
  const std::string text =
      R"({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [4, 5, 6]})"
      "\n"
      R"({"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [4]})"
      "\n"
      R"({"timestamp": 0, "input_length": 50, "output_length": 1, "hash_ids": []})";
  auto trace = ParseTrace(TraceFormat::kMooncake, text, "t.jsonl", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  // Extra ids dropped.
  ASSERT_EQ((*trace)[0].segments.size(), 1u);
  EXPECT_EQ((*trace)[0].segments[0].length, 100);
  // Missing ids: the tail is the request's private stream.
  const TraceRequest& r1 = (*trace)[1];
  ASSERT_EQ(r1.segments.size(), 2u);
  EXPECT_EQ(r1.segments[0].length, 512);
  EXPECT_EQ(r1.segments[1].length, 1100 - 512);
  EXPECT_EQ(r1.segments[1].key, StreamKey(0, StreamKind::kRequestUnique, 1));
  ASSERT_EQ((*trace)[2].segments.size(), 1u);
  EXPECT_EQ((*trace)[2].segments[0].key, StreamKey(0, StreamKind::kRequestUnique, 2));
}

TEST(MooncakeTest, MalformedRowsNameFileLineAndValue) {
  const std::string good =
      R"({"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [0]})" "\n";
  struct Case {
    std::string row;
    std::string expected;
  } cases[] = {
      {R"({"input_length": 10, "output_length": 2, "hash_ids": [0]})", "'timestamp' is missing"},
      {R"({"timestamp": 6, "output_length": 2, "hash_ids": [0]})", "'input_length' is missing"},
      {R"({"timestamp": 6, "input_length": -3, "output_length": 2, "hash_ids": [0]})",
       "input_length -3"},
      {R"({"timestamp": 6, "input_length": 10, "output_length": 0, "hash_ids": [0]})",
       "output_length 0"},
      {R"({"timestamp": 6, "input_length": "ten", "output_length": 2, "hash_ids": [0]})",
       "\"ten\""},
      {R"({"timestamp": 4, "input_length": 10, "output_length": 2, "hash_ids": [0]})",
       "timestamp 4 goes back"},
      {R"({"timestamp": 6, "input_length": 10, "output_length": 2, "hash_ids": [-1]})",
       "hash id -1"},
      {R"({"timestamp": 6, "input_length": 10, "output_length": 2})", "'hash_ids'"},
      {R"({"timestamp": 6, "input_length": 10,)", "not valid JSON (parse error at line 1"},
      {"[1, 2]", "not a JSON object: '[1, 2]'"},
      // Invalid UTF-8 and a lone surrogate are named as such, not as "not a JSON object".
      {"{\"timestamp\": 6, \"x\": \"\xff\"}", "ill-formed UTF-8 byte"},
      {R"({"timestamp": 6, "x": "\ud800"})", "surrogate U+D800..U+DBFF must be followed by"},
      // The JSON reader would stop at the NUL and take the row, dropping what follows.
      {std::string(R"({"timestamp": 6, "input_length": 10, "output_length": 2, "hash_ids": [0]})"
                   "\0garbage", 81),
       "NUL byte at column 74"},
  };
  for (const Case& c : cases) {
    absl::Status st = ParseError(TraceFormat::kMooncake, good + c.row + "\n");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.row;
    EXPECT_THAT(st.message(), HasSubstr("t.txt:2: ")) << c.row;
    EXPECT_THAT(st.message(), HasSubstr(c.expected)) << c.row;
  }
  absl::Status empty = ParseError(TraceFormat::kMooncake, "\n  \n");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("no requests"));
}

TEST(AzureTest, ArrivalsAreSecondsAfterTheFirstRowAcrossMidnight) {
  const std::string text =
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.6805900,374,44\r\n"
      "2023-11-16 18:15:50.9951690,396,109\n"
      "2023-11-17 00:00:00,10,1\n"
      "2024-03-01T00:00:01.5Z,10,1\n";
  auto trace = ParseTrace(TraceFormat::kAzure, text, "t.csv", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 4u);
  EXPECT_DOUBLE_EQ((*trace)[0].arrival_s, 0.0);
  EXPECT_NEAR((*trace)[1].arrival_s, 4.314579, 1e-9);
  // 18:15:46.68059 to midnight: 5 h 44 min 13.31941 s.
  EXPECT_NEAR((*trace)[2].arrival_s, 20653.31941, 1e-9);
  // 2023-11-16 18:15:46.68059 to 2024-03-01 00:00:01.5: 106 days minus 18:15:45.18059.
  EXPECT_NEAR((*trace)[3].arrival_s, 106 * 86400.0 - 65745.18059, 1e-6);
  EXPECT_EQ((*trace)[0].prompt_len, 374);
  EXPECT_EQ((*trace)[0].output_len, 44);
  EXPECT_EQ((*trace)[1].segments.size(), 1u);
  EXPECT_EQ((*trace)[1].segments[0].key, StreamKey(0, StreamKind::kRequestUnique, 1));
}

TEST(AzureTest, MalformedRowsNameFileLineAndValue) {
  const std::string head =
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n";
  struct Case {
    std::string row;
    std::string expected;
  } cases[] = {
      {"2023-11-16 18:15:47,12", "has 2 fields"},
      {"2023-11-16 18:15:47,-5,3", "ContextTokens -5"},
      {"2023-11-16 18:15:47,5,x3", "GeneratedTokens 'x3'"},
      {"2023-11-16 18:15:45,5,3", "'2023-11-16 18:15:45' goes back"},
      {"16/11/2023 18:15:47,5,3", "TIMESTAMP '16/11/2023 18:15:47'"},
      {"2023-13-16 18:15:47,5,3", "TIMESTAMP '2023-13-16 18:15:47'"},
      {"2023-02-31 18:15:47,5,3", "TIMESTAMP '2023-02-31 18:15:47': 2023-02 has 28 days"},
      {"2023-11-31 18:15:47,5,3", "2023-11 has 30 days"},
  };
  for (const Case& c : cases) {
    absl::Status st = ParseError(TraceFormat::kAzure, head + c.row + "\n");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.row;
    EXPECT_THAT(st.message(), HasSubstr("t.txt:3: ")) << c.row;
    EXPECT_THAT(st.message(), HasSubstr(c.expected)) << st.message();
  }
  // 29 February exists in leap years only.
  EXPECT_TRUE(ParseTrace(TraceFormat::kAzure,
                         "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-02-29 00:00:00,5,3\n",
                         "t.txt", {})
                  .ok());
  EXPECT_THAT(ParseError(TraceFormat::kAzure,
                         "TIMESTAMP,ContextTokens,GeneratedTokens\n2100-02-29 00:00:00,5,3\n")
                  .message(),
              HasSubstr("2100-02 has 28 days"));
  absl::Status header = ParseError(TraceFormat::kAzure, "TIME,ContextTokens,GeneratedTokens\n");
  EXPECT_THAT(header.message(), HasSubstr("t.txt:1: header"));
  EXPECT_THAT(header.message(), HasSubstr("'TIMESTAMP'"));
  EXPECT_THAT(ParseError(TraceFormat::kAzure, "TIMESTAMP,ContextTokens,GeneratedTokens\n").message(),
              HasSubstr("no requests"));
  EXPECT_EQ(ReadTrace(TraceFormat::kAzure, "/nonexistent/x.csv", {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LengthsTest, FixedPoissonAndBurstArrivals) {
  const std::string text =
      "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
      "74,918,992,0.08\n100,20,120,5\n7,3,10,2.3\n";
  TraceOptions fixed;
  fixed.arrival = {ArrivalKind::kFixed, 4.0};
  auto trace = ParseTrace(TraceFormat::kLengths, text, "t.csv", fixed);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 3u);
  EXPECT_DOUBLE_EQ((*trace)[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ((*trace)[1].arrival_s, 0.25);
  EXPECT_DOUBLE_EQ((*trace)[2].arrival_s, 0.5);
  EXPECT_EQ((*trace)[0].prompt_len, 74);
  EXPECT_EQ((*trace)[0].output_len, 918);

  TraceOptions burst;
  burst.arrival = {ArrivalKind::kBurst, 0.0};
  trace = ParseTrace(TraceFormat::kLengths, text, "t.csv", burst);
  ASSERT_TRUE(trace.ok());
  EXPECT_DOUBLE_EQ((*trace)[2].arrival_s, 0.0);

  TraceOptions poisson;
  poisson.arrival = {ArrivalKind::kPoisson, 2.0};
  poisson.seed = 11;
  auto p1 = ParseTrace(TraceFormat::kLengths, text, "t.csv", poisson);
  auto p2 = ParseTrace(TraceFormat::kLengths, text, "t.csv", poisson);
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_DOUBLE_EQ((*p1)[0].arrival_s, 0.0);
  EXPECT_GT((*p1)[1].arrival_s, 0.0);
  EXPECT_GT((*p1)[2].arrival_s, (*p1)[1].arrival_s);
  EXPECT_EQ((*p1)[2].arrival_s, (*p2)[2].arrival_s);  // same seed, same arrivals

  TraceOptions bad_rate;
  bad_rate.arrival = {ArrivalKind::kPoisson, 0.0};
  EXPECT_THAT(ParseError(TraceFormat::kLengths, text, bad_rate).message(),
              HasSubstr("arrival rate"));
  EXPECT_THAT(ParseError(TraceFormat::kLengths, "num_prefill_tokens,num_decode_tokens\n5,0\n")
                  .message(),
              HasSubstr("t.txt:2: num_decode_tokens 0"));
}

TEST(LengthsTest, PoissonRateMatchesOverTheShareGptFile) {
  TraceOptions options;
  options.arrival = {ArrivalKind::kPoisson, 10.0};
  auto trace = ReadTrace(TraceFormat::kLengths,
                         kTraces + "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                         options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 30731u);
  // 30,730 exponential gaps of mean 0.1 s: the total is within 3% (about 5 sigma) of 3,073 s.
  EXPECT_NEAR(trace->back().arrival_s, 3073.0, 3073.0 * 0.03);
  auto arxiv = ReadTrace(TraceFormat::kLengths,
                         kTraces + "vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                         options);
  ASSERT_TRUE(arxiv.ok()) << arxiv.status();
  EXPECT_EQ(arxiv->size(), 28257u);
}

TEST(RealTraceTest, AzureConversationSpansItsHour) {
  auto trace = ReadTrace(TraceFormat::kAzure, kTraces + "AzureLLMInferenceTrace_conv.csv", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 19366u);
  // 18:15:46.6805900 -> 19:14:08.4025270.
  EXPECT_NEAR(trace->back().arrival_s, 3501.721937, 1e-6);
  TraceOptions first10;
  first10.max_requests = 10;
  auto head = ReadTrace(TraceFormat::kAzure, kTraces + "AzureLLMInferenceTrace_code.csv", first10);
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size(), 10u);
  EXPECT_EQ((*head)[0].prompt_len, 4808);
}

TEST(SyntheticTest, SharedPrefixGroupsAndDistributions) {
  SyntheticTraceOptions o;
  o.num_requests = 200;
  o.arrival = {ArrivalKind::kFixed, 10.0};
  o.prompt_len = {LengthDistribution::Kind::kUniform, 100, 200, 1, 1 << 20};
  o.output_len = {LengthDistribution::Kind::kLogNormal, 50, 0.5, 1, 80};
  o.shared_prefix_fraction = 0.5;
  o.num_prefix_groups = 3;
  o.seed = 5;
  auto trace = GenerateSyntheticTrace(o);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 200u);
  EXPECT_DOUBLE_EQ((*trace)[199].arrival_s, 19.9);
  std::vector<uint64_t> groups;
  for (const TraceRequest& r : *trace) {
    EXPECT_GE(r.prompt_len, 100);
    EXPECT_LE(r.prompt_len, 200);
    EXPECT_GE(r.output_len, 1);
    EXPECT_LE(r.output_len, 80);
    ASSERT_EQ(r.segments.size(), 2u);
    EXPECT_EQ(r.segments[0].length, r.prompt_len / 2);
    if (std::find(groups.begin(), groups.end(), r.segments[0].key) == groups.end()) {
      groups.push_back(r.segments[0].key);
    }
  }
  EXPECT_EQ(groups.size(), 3u);
  auto again = GenerateSyntheticTrace(o);
  EXPECT_EQ(PromptTokens((*again)[17]), PromptTokens((*trace)[17]));

  o.num_prefix_groups = 0;
  EXPECT_THAT(GenerateSyntheticTrace(o).status().message(), HasSubstr("num_prefix_groups"));
  o.num_prefix_groups = 1;
  o.prompt_len.kind = LengthDistribution::Kind::kLogNormal;
  o.prompt_len.a = -1;
  EXPECT_THAT(GenerateSyntheticTrace(o).status().message(), HasSubstr("prompt_len"));
  // Every request stays in memory for a run: 2^20 at most.
  o.prompt_len.a = 10;
  o.num_requests = kMaxSyntheticRequests + 1;
  EXPECT_THAT(GenerateSyntheticTrace(o).status().message(),
              HasSubstr("num_requests must be in [1, 1048576], got 1048577"));
}

// Hand-made trace with block size 4; A and B are two token streams.
TEST(IdealPrefixHitsTest, HandMadeTrace) {
  const uint64_t a = StreamKey(1, StreamKind::kPrefixGroup, 0);
  const uint64_t b = StreamKey(1, StreamKind::kPrefixGroup, 1);
  auto req = [](std::vector<PromptSegment> segs) {
    TraceRequest r;
    for (const PromptSegment& s : segs) r.prompt_len += s.length;
    r.segments = std::move(segs);
    return r;
  };
  std::vector<TraceRequest> trace = {
      req({{a, 10}}),           // nothing cached: 0. Caches A[0,4) A[4,8).
      req({{a, 8}}),            // 2 blocks match, cap (8-1)/4 = 1 block: 4
      req({{a, 12}}),           // 2 blocks match, cap 11/4 = 2: 8. Caches A[8,12).
      req({{a, 6}, {b, 6}}),    // A[0,4) matches; A4 A5 B0 B1 does not: 4
      req({{b, 5}}),            // B[0,4) never cached as a first block: 0
      req({{a, 12}, {b, 4}}),   // A[0,12) matches, B[0,4) after A12 is new; cap 15/4 = 3: 12
  };
  IdealPrefixHits hits = ComputeIdealPrefixHits(trace, 4);
  EXPECT_EQ(hits.num_requests, 6);
  EXPECT_EQ(hits.input_tokens, 10 + 8 + 12 + 12 + 5 + 16);
  EXPECT_EQ(hits.hit_tokens, 0 + 4 + 8 + 4 + 0 + 12);

  // Block size 1: the cap is one token short of the prompt.
  hits = ComputeIdealPrefixHits({req({{a, 3}}), req({{a, 3}}), req({{a, 2}})}, 1);
  EXPECT_EQ(hits.hit_tokens, 0 + 2 + 1);
  // A prompt shorter than a block never hits.
  hits = ComputeIdealPrefixHits({req({{a, 3}}), req({{a, 3}})}, 4);
  EXPECT_EQ(hits.hit_tokens, 0);
}

// The number the simulator must land within 2% below: the Mooncake conversation trace with
// unlimited 16-token blocks. Cross-checked with an independent pass over the hash ids (a
// 16-token block at offset o of 512-block i is identified by (hash_ids[i], o), since an id
// names its whole prefix): 54,097,440 of 144,793,823 prompt tokens (37.36%).
TEST(RealTraceTest, MooncakeConversationIdealPrefixHits) {
  auto trace = ReadTrace(TraceFormat::kMooncake, kTraces + "mooncake_conversation_trace.jsonl", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 12031u);
  EXPECT_DOUBLE_EQ(trace->back().arrival_s, 3536.999);
  IdealPrefixHits hits = ComputeIdealPrefixHits(*trace, 16);
  EXPECT_EQ(hits.num_requests, 12031);
  EXPECT_EQ(hits.input_tokens, 144793823);
  EXPECT_EQ(hits.hit_tokens, 54097440);
  // With Mooncake's own 512-token blocks.
  EXPECT_EQ(ComputeIdealPrefixHits(*trace, 512).hit_tokens, 54063104);
}

TEST(RealTraceTest, MooncakeSyntheticIdealPrefixHits) {
  auto trace = ReadTrace(TraceFormat::kMooncake, kTraces + "mooncake_synthetic_trace.jsonl", {});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 3993u);
  IdealPrefixHits hits = ComputeIdealPrefixHits(*trace, 16);
  EXPECT_EQ(hits.input_tokens, 61194628);
  EXPECT_EQ(hits.hit_tokens, 39850800);
}

}  // namespace
}  // namespace kvpage::sim
