// Request traces for the simulator: readers for public trace formats, a synthetic generator,
// and the ideal prefix-cache hit count of a trace.
//
// A `TraceRequest` is one request as the simulator replays it: when it arrives, its prompt and
// how many tokens it generates. Prompts are *described*, not stored: a prompt is a list of
// `PromptSegment`s, each the first `length` tokens of a deterministic pseudo-random token stream
// named by a 64-bit key. `PromptTokens()` materialises the ids on demand. The Mooncake
// conversation trace holds 144.8 M prompt tokens (579 MB as int32), while its segment list is
// under 5 MB; the simulator only needs the tokens of requests it is about to schedule.
//
// Token streams (the rule every reader and the generator share):
//   token j of the stream with key k = SplitMix64Finalize(k + (j + 1) · 0x9E3779B97F4A7C15)
//                                      mod vocab_size
// i.e. the (j+1)-th output of a splitmix64 generator seeded with k. Equal keys give equal
// tokens, so requests that share a key share a prefix and hit the prefix cache through the
// real block hashing; distinct keys collide on a 16-token block with probability ~vocab^-16.
//
// Keys:
//   * Mooncake hash id h (one 512-token block): StreamKey(seed, kMooncakeBlock, h).
//   * A request's private tokens (Azure, length-only CSVs, synthetic suffixes, Mooncake
//     tokens not covered by hash ids): StreamKey(seed, kRequestUnique, request index).
//   * A synthetic shared-prefix group g: StreamKey(seed, kPrefixGroup, g).
//
// Everything here is deterministic for a given input and seed and uses no global state; all
// functions are thread-compatible. Errors are absl::InvalidArgumentError naming the file (or
// the `source` string), the 1-based line and the offending value; unreadable files NotFound.
#ifndef KVPAGE_SIM_TRACE_H_
#define KVPAGE_SIM_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvpage::sim {

// Token ids are drawn from [0, vocab_size). 100,000 is below every bundled model's vocabulary
// except Mistral-7B-v0.3 (32,768); kvpage sim uses the model's when it is smaller (the
// scheduler refuses token ids outside the model's vocabulary).
inline constexpr int32_t kDefaultTraceVocabSize = 100000;
// Mooncake hash ids each cover this many tokens (FAST'25 release README).
inline constexpr int32_t kMooncakeBlockTokens = 512;

enum class StreamKind : uint64_t { kMooncakeBlock = 1, kRequestUnique = 2, kPrefixGroup = 3 };

// The key of token stream `id` of `kind` under `seed` (see the file comment).
uint64_t StreamKey(uint64_t seed, StreamKind kind, uint64_t id);

// The first `length` tokens of the stream with key `key`.
struct PromptSegment {
  uint64_t key = 0;
  int32_t length = 0;
  friend bool operator==(const PromptSegment&, const PromptSegment&) = default;
};

struct TraceRequest {
  int64_t index = 0;         // 0-based position in the trace (file order = arrival order)
  double arrival_s = 0.0;    // seconds since the trace's first arrival (or time 0)
  int32_t prompt_len = 0;    // sum of segments' lengths; >= 1
  int32_t output_len = 0;    // tokens to generate, >= 1
  int32_t vocab_size = kDefaultTraceVocabSize;
  std::vector<PromptSegment> segments;
};

// Appends the request's prompt token ids to *out (prompt_len of them).
// REQUIRES: request.vocab_size >= 2.
void AppendPromptTokens(const TraceRequest& request, std::vector<int32_t>* out);
std::vector<int32_t> PromptTokens(const TraceRequest& request);

// ---- Arrival processes (length-only traces and the synthetic generator) -------------------

enum class ArrivalKind : uint8_t {
  kPoisson,  // first arrival at 0, then exponential gaps with mean 1 / rate_per_s
  kFixed,    // request i arrives at i / rate_per_s
  kBurst,    // everything arrives at time 0 (rate ignored): an offline throughput run
};

struct ArrivalOptions {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double rate_per_s = 1.0;  // > 0 and finite unless kind == kBurst
  absl::Status Validate() const;
};

// ---- Readers -------------------------------------------------------------------------------

enum class TraceFormat : uint8_t {
  kMooncake,  // "mooncake": JSON Lines {timestamp (ms), input_length, output_length, hash_ids}
  kAzure,     // "azure": CSV TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM inference 2023)
  kLengths,   // "lengths": CSV with num_prefill_tokens,num_decode_tokens columns (vidur/sarathi)
};

// "mooncake", "azure", "lengths" (case-insensitive). InvalidArgument listing them otherwise.
absl::StatusOr<TraceFormat> ParseTraceFormat(absl::string_view name);
absl::string_view TraceFormatName(TraceFormat format);

struct TraceOptions {
  uint64_t seed = 0;  // token streams, and Poisson gaps of length-only traces
  int32_t vocab_size = kDefaultTraceVocabSize;  // >= 2
  ArrivalOptions arrival;    // only kLengths: these files carry no timestamps
  int64_t max_requests = 0;  // keep only the first N rows (the rest are not read); 0 keeps all
  absl::Status Validate() const;
};

// Parses trace text; `source` (usually the path) prefixes every error.
//
// Mooncake rows: `timestamp` ms (non-decreasing), `input_length` >= 1, `output_length` >= 1,
// `hash_ids` an array of non-negative integers. Block i of the prompt is the first
// min(512, input_length − 512·i) tokens of hash id i's stream. In the published files
// ceil(input_length / 512) == hash_ids.size() on every row (checked over both FAST'25 traces);
// other rows are not rejected but normalised: ids beyond ceil(input_length / 512) are dropped,
// and prompt tokens beyond 512 · hash_ids.size() come from the request's private stream.
//
// Azure rows: TIMESTAMP `YYYY-MM-DD HH:MM:SS[.fraction]` (a 'T' separator and a trailing 'Z' or
// '+00:00' are accepted), non-decreasing; arrival = seconds after the first row's timestamp.
// ContextTokens >= 1 and GeneratedTokens >= 1. The whole prompt is the request's private
// stream (the trace has no prefix information).
//
// Length rows: num_prefill_tokens >= 1 and num_decode_tokens >= 1 (other columns ignored);
// private-stream prompts; arrivals from `options.arrival`.
//
// A header line is required for the CSV formats (columns are found by name). Blank lines are
// skipped. A trace without requests is an error.
//
// Memory: rows are parsed as they are read, and each keeps only its request (a Mooncake row
// at most the 4,194,304 ids a 2^31 − 1 token prompt uses, however long its list). Refused as
// too large to be rows: a CSV line over 1 MiB, and a JSON token (a string, a number, or the
// space before one) over 64 MiB.
absl::StatusOr<std::vector<TraceRequest>> ParseTrace(TraceFormat format, absl::string_view text,
                                                     absl::string_view source,
                                                     const TraceOptions& options);

// Reads `path` and parses it as above, in 1 MiB pieces (the file is never held whole).
// NotFound when the file cannot be opened; DataLoss when reading it fails midway.
absl::StatusOr<std::vector<TraceRequest>> ReadTrace(TraceFormat format, const std::string& path,
                                                    const TraceOptions& options);

// ---- Synthetic generator -------------------------------------------------------------------

// A length distribution, clamped to [min, max] after rounding to the nearest integer.
struct LengthDistribution {
  enum class Kind : uint8_t {
    kFixed,      // always `a`
    kUniform,    // integers uniform in [a, b]
    kLogNormal,  // median a, log-space standard deviation b: a · exp(b · N(0, 1))
  };
  Kind kind = Kind::kFixed;
  double a = 1.0;
  double b = 0.0;
  int32_t min = 1;
  int32_t max = 1 << 20;
  absl::Status Validate(absl::string_view what) const;
};

// The most requests one synthetic trace holds. Each stays in memory for a whole run (its
// description here, its record and token times in the result): about 100 bytes plus 8 per
// output token, over 1 GiB at 2^20 requests of 128 output tokens.
inline constexpr int64_t kMaxSyntheticRequests = int64_t{1} << 20;

struct SyntheticTraceOptions {
  int64_t num_requests = 100;  // in [1, kMaxSyntheticRequests]
  ArrivalOptions arrival;
  LengthDistribution prompt_len{LengthDistribution::Kind::kFixed, 1024.0, 0.0, 1, 1 << 20};
  LengthDistribution output_len{LengthDistribution::Kind::kFixed, 128.0, 0.0, 1, 1 << 20};
  // Each request picks one of `num_prefix_groups` groups uniformly at random; its first
  // floor(shared_prefix_fraction · prompt_len) tokens are that group's stream (shared with
  // every other request of the group), the rest its private stream.
  double shared_prefix_fraction = 0.0;  // in [0, 1]
  int32_t num_prefix_groups = 1;        // >= 1
  uint64_t seed = 0;
  int32_t vocab_size = kDefaultTraceVocabSize;
  absl::Status Validate() const;
};

// InvalidArgument naming the field when `options` is invalid.
absl::StatusOr<std::vector<TraceRequest>> GenerateSyntheticTrace(
    const SyntheticTraceOptions& options);

// ---- Ideal prefix caching ------------------------------------------------------------------

struct IdealPrefixHits {
  int64_t num_requests = 0;
  int64_t input_tokens = 0;  // sum of prompt lengths
  int64_t hit_tokens = 0;    // prompt tokens an unlimited prefix cache would serve
};

// The prefix-cache hits of an unlimited cache with `block_size`-token blocks: requests in
// trace order, every earlier prompt fully cached (all its full blocks). A request hits its
// longest prefix of whole blocks that equals a prefix of some earlier prompt, capped at
// floor((prompt_len − 1) / block_size) blocks because the last prompt token is always
// computed (to produce the first output token). Prompts are compared by their token ids
// (chained 64-bit hashes of whole blocks; a false match needs a 64-bit collision).
// REQUIRES: block_size >= 1.
IdealPrefixHits ComputeIdealPrefixHits(const std::vector<TraceRequest>& trace,
                                       int32_t block_size);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_TRACE_H_
