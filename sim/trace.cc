#include "sim/trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "internal/status_macros.h"
#include "sim/random.h"
#include "sim/trace_input.h"
#include "sim/trace_readers.h"

namespace kvpage::sim {

absl::Status LineError(absl::string_view source, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", what));
}

absl::StatusOr<int32_t> ParseCount(absl::string_view cell, absl::string_view field,
                                   absl::string_view source, int64_t line) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(cell, &v)) {
    return LineError(source, line, absl::StrCat(field, " '", cell, "' is not an integer"));
  }
  if (v < 1 || v > std::numeric_limits<int32_t>::max()) {
    return LineError(source, line, absl::StrCat(field, " ", v, " must be in [1, 2147483647]"));
  }
  return static_cast<int32_t>(v);
}

namespace {

// A CSV row of these formats is a few short cells; a longer line is not one.
constexpr size_t kMaxCsvLineBytes = size_t{1} << 20;

// A request whose whole prompt is its private stream.
TraceRequest PrivateRequest(const TraceOptions& options, int64_t index, double arrival_s,
                            int32_t prompt_len, int32_t output_len) {
  TraceRequest r;
  r.index = index;
  r.arrival_s = arrival_s;
  r.prompt_len = prompt_len;
  r.output_len = output_len;
  r.vocab_size = options.vocab_size;
  r.segments.push_back(
      {StreamKey(options.seed, StreamKind::kRequestUnique, static_cast<uint64_t>(index)),
       prompt_len});
  return r;
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// Days in month m (1-12) of year y, proleptic Gregorian.
int64_t DaysInMonth(int64_t y, int64_t m) {
  static constexpr int64_t kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : kDays[m - 1];
}

// Seconds since the epoch as (whole, fraction) so a fraction's 7 digits survive the subtraction.
struct WallTime {
  int64_t seconds = 0;
  double fraction = 0.0;
};

// Whether s has the punctuation of "YYYY-MM-DD HH:MM:SS" ('T' may join date and time).
bool HasWallTimeShape(absl::string_view s) {
  return s.size() >= 19 && s[4] == '-' && s[7] == '-' && (s[10] == ' ' || s[10] == 'T') &&
         s[13] == ':' && s[16] == ':';
}

// The year, month, day, hour, minute and second of a string HasWallTimeShape accepts; false
// when a field is not all digits or out of its range (the day only below: its month's length
// is checked apart, for its own message).
bool ParseWallTimeFields(absl::string_view s, int64_t (&f)[6]) {
  const size_t pos[6] = {0, 5, 8, 11, 14, 17}, len[6] = {4, 2, 2, 2, 2, 2};
  for (int i = 0; i < 6; ++i) {
    absl::string_view part = s.substr(pos[i], len[i]);
    if (!std::all_of(part.begin(), part.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(part, &f[i])) {
      return false;
    }
  }
  return f[1] >= 1 && f[1] <= 12 && f[2] >= 1 && f[3] <= 23 && f[4] <= 59 && f[5] <= 60;
}

// Adds ".digits" (what follows the seconds; may be empty) to *fraction; false on anything else.
bool AddWallTimeFraction(absl::string_view rest, double* fraction) {
  if (rest.empty()) return true;
  if (rest[0] != '.' || rest.size() == 1) return false;
  double scale = 0.1;
  for (char c : rest.substr(1)) {
    if (!absl::ascii_isdigit(c)) return false;
    *fraction += (c - '0') * scale;
    scale /= 10;
  }
  return true;
}

absl::StatusOr<WallTime> ParseWallTime(absl::string_view cell, absl::string_view source,
                                       int64_t line) {
  absl::string_view s = cell;
  if (!absl::ConsumeSuffix(&s, "Z")) absl::ConsumeSuffix(&s, "+00:00");
  auto bad = [&] {
    return LineError(source, line, absl::StrCat("TIMESTAMP '", cell,
                                                "' is not 'YYYY-MM-DD HH:MM:SS[.fraction]'"));
  };
  int64_t f[6];
  if (!HasWallTimeShape(s) || !ParseWallTimeFields(s, f)) return bad();
  if (f[2] > DaysInMonth(f[0], f[1])) {
    return LineError(source, line, absl::StrCat("TIMESTAMP '", cell, "': ", s.substr(0, 7),
                                                " has ", DaysInMonth(f[0], f[1]), " days"));
  }
  WallTime t;
  t.seconds = DaysFromCivil(f[0], f[1], f[2]) * 86400 + f[3] * 3600 + f[4] * 60 + f[5];
  if (!AddWallTimeFraction(s.substr(19), &t.fraction)) return bad();
  return t;
}

// The header's column index of each name in `wanted`, or an error naming the missing one.
absl::StatusOr<std::vector<size_t>> FindColumns(absl::string_view header,
                                                const std::vector<absl::string_view>& wanted,
                                                absl::string_view source, int64_t line) {
  std::vector<std::string> cols = absl::StrSplit(header, ',');
  for (std::string& c : cols) c = std::string(absl::StripAsciiWhitespace(c));
  std::vector<size_t> idx;
  for (absl::string_view w : wanted) {
    auto it = std::find(cols.begin(), cols.end(), w);
    if (it == cols.end()) {
      return LineError(source, line, absl::StrCat("header '", header, "' lacks column '", w, "'"));
    }
    idx.push_back(static_cast<size_t>(it - cols.begin()));
  }
  return idx;
}

// Splits a CSV row (no quoting in these formats) and checks it reaches every wanted column.
absl::StatusOr<std::vector<absl::string_view>> Cells(absl::string_view row,
                                                     const std::vector<size_t>& columns,
                                                     absl::string_view source, int64_t line) {
  std::vector<absl::string_view> cells = absl::StrSplit(row, ',');
  const size_t need = *std::max_element(columns.begin(), columns.end()) + 1;
  if (cells.size() < need) {
    return LineError(source, line, absl::StrCat("row '", row, "' has ", cells.size(),
                                                " fields, expected at least ", need));
  }
  std::vector<absl::string_view> picked;
  for (size_t c : columns) picked.push_back(absl::StripAsciiWhitespace(cells[c]));
  return picked;
}

// Calls fn(line_text, line_number) for every non-blank line until done() or the input's end;
// stops at the first error.
template <typename Done, typename Fn>
absl::Status ForEachLine(TraceInput& in, absl::string_view source, Done done, Fn fn) {
  while (!done() && in.NextLine()) {
    KVPAGE_ASSIGN_OR_RETURN(absl::string_view line, in.TakeLine(source, kMaxCsvLineBytes));
    KVPAGE_RETURN_IF_ERROR(fn(line, in.line()));
  }
  return absl::OkStatus();
}

absl::Status ParseAzure(TraceInput& in, absl::string_view source,
                        const TraceOptions& options, std::vector<TraceRequest>* out) {
  std::vector<size_t> columns;
  WallTime first, last;
  const auto done = [&] {
    return !columns.empty() && options.max_requests > 0 &&
           static_cast<int64_t>(out->size()) >= options.max_requests;
  };
  return ForEachLine(in, source, done, [&](absl::string_view line,
                                           int64_t line_no) -> absl::Status {
    if (columns.empty()) {
      KVPAGE_ASSIGN_OR_RETURN(columns, FindColumns(line, {"TIMESTAMP", "ContextTokens",
                                                          "GeneratedTokens"}, source, line_no));
      return absl::OkStatus();
    }
    KVPAGE_ASSIGN_OR_RETURN(std::vector<absl::string_view> cells,
                            Cells(line, columns, source, line_no));
    KVPAGE_ASSIGN_OR_RETURN(WallTime t, ParseWallTime(cells[0], source, line_no));
    if (out->empty()) first = last = t;
    if (t.seconds < last.seconds || (t.seconds == last.seconds && t.fraction < last.fraction)) {
      return LineError(source, line_no, absl::StrCat("TIMESTAMP '", cells[0],
                                                     "' goes back in time"));
    }
    last = t;
    KVPAGE_ASSIGN_OR_RETURN(int32_t prompt, ParseCount(cells[1], "ContextTokens", source, line_no));
    KVPAGE_ASSIGN_OR_RETURN(int32_t output,
                            ParseCount(cells[2], "GeneratedTokens", source, line_no));
    const double arrival = static_cast<double>(t.seconds - first.seconds) +
                           (t.fraction - first.fraction);
    out->push_back(PrivateRequest(options, static_cast<int64_t>(out->size()), arrival, prompt,
                                  output));
    return absl::OkStatus();
  });
}

absl::Status ParseLengths(TraceInput& in, absl::string_view source,
                          const TraceOptions& options, std::vector<TraceRequest>* out) {
  std::vector<size_t> columns;
  ArrivalClock clock(options.arrival, options.seed);
  const auto done = [&] {
    return !columns.empty() && options.max_requests > 0 &&
           static_cast<int64_t>(out->size()) >= options.max_requests;
  };
  return ForEachLine(in, source, done, [&](absl::string_view line,
                                           int64_t line_no) -> absl::Status {
    if (columns.empty()) {
      KVPAGE_ASSIGN_OR_RETURN(columns, FindColumns(line, {"num_prefill_tokens",
                                                          "num_decode_tokens"}, source, line_no));
      return absl::OkStatus();
    }
    KVPAGE_ASSIGN_OR_RETURN(std::vector<absl::string_view> cells,
                            Cells(line, columns, source, line_no));
    KVPAGE_ASSIGN_OR_RETURN(int32_t prompt,
                            ParseCount(cells[0], "num_prefill_tokens", source, line_no));
    KVPAGE_ASSIGN_OR_RETURN(int32_t output,
                            ParseCount(cells[1], "num_decode_tokens", source, line_no));
    out->push_back(PrivateRequest(options, static_cast<int64_t>(out->size()), clock.Next(),
                                  prompt, output));
    return absl::OkStatus();
  });
}

}  // namespace

uint64_t StreamKey(uint64_t seed, StreamKind kind, uint64_t id) {
  return SplitMix64Finalize(SplitMix64Finalize(seed ^ (static_cast<uint64_t>(kind) << 56)) + id);
}

void AppendPromptTokens(const TraceRequest& request, std::vector<int32_t>* out) {
  KVPAGE_DCHECK(request.vocab_size >= 2);
  const uint64_t vocab = static_cast<uint64_t>(request.vocab_size);
  out->reserve(out->size() + static_cast<size_t>(request.prompt_len));
  for (const PromptSegment& seg : request.segments) {
    uint64_t state = seg.key;
    for (int32_t j = 0; j < seg.length; ++j) {
      state += kSplitMix64Gamma;
      out->push_back(static_cast<int32_t>(SplitMix64Finalize(state) % vocab));
    }
  }
}

std::vector<int32_t> PromptTokens(const TraceRequest& request) {
  std::vector<int32_t> tokens;
  AppendPromptTokens(request, &tokens);
  return tokens;
}

absl::Status ArrivalOptions::Validate() const {
  if (kind == ArrivalKind::kBurst) return absl::OkStatus();
  if (!(rate_per_s > 0) || !std::isfinite(rate_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arrival rate must be a positive finite number of requests/s, got ",
                     rate_per_s));
  }
  return absl::OkStatus();
}

absl::Status TraceOptions::Validate() const {
  if (vocab_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 2, got ", vocab_size));
  }
  if (max_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_requests must be >= 0, got ", max_requests));
  }
  return arrival.Validate();
}

absl::StatusOr<TraceFormat> ParseTraceFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "mooncake") return TraceFormat::kMooncake;
  if (lower == "azure") return TraceFormat::kAzure;
  if (lower == "lengths") return TraceFormat::kLengths;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown trace format '", name, "': expected mooncake, azure or lengths"));
}

absl::string_view TraceFormatName(TraceFormat format) {
  switch (format) {
    case TraceFormat::kMooncake: return "mooncake";
    case TraceFormat::kAzure: return "azure";
    case TraceFormat::kLengths: return "lengths";
  }
  return "unknown";
}

namespace {

// The requests of `in`, read to its end (or options.max_requests).
absl::StatusOr<std::vector<TraceRequest>> ReadRequests(TraceFormat format, TraceInput& in,
                                                       absl::string_view source,
                                                       const TraceOptions& options) {
  KVPAGE_RETURN_IF_ERROR(options.Validate());
  std::vector<TraceRequest> out;
  switch (format) {
    case TraceFormat::kMooncake:
      KVPAGE_RETURN_IF_ERROR(ReadMooncake(in, source, options, &out));
      break;
    case TraceFormat::kAzure:
      KVPAGE_RETURN_IF_ERROR(ParseAzure(in, source, options, &out));
      break;
    case TraceFormat::kLengths:
      KVPAGE_RETURN_IF_ERROR(ParseLengths(in, source, options, &out));
      break;
  }
  if (in.failed()) {
    return absl::DataLossError(
        absl::StrCat(source, ":", in.line(), ": reading the trace failed"));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no requests in this ", TraceFormatName(format), " trace"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> ParseTrace(TraceFormat format, absl::string_view text,
                                                     absl::string_view source,
                                                     const TraceOptions& options) {
  TraceInput in(text);
  return ReadRequests(format, in, source, options);
}

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(TraceFormat format, const std::string& path,
                                                    const TraceOptions& options) {
  KVPAGE_ASSIGN_OR_RETURN(std::unique_ptr<TraceInput> in, TraceInput::Open(path));
  return ReadRequests(format, *in, path, options);
}

IdealPrefixHits ComputeIdealPrefixHits(const std::vector<TraceRequest>& trace,
                                       int32_t block_size) {
  KVPAGE_DCHECK(block_size >= 1);
  // Each full block is identified by a hash chained over all blocks before it, so a set of
  // chain hashes is a trie of every cached prefix.
  absl::flat_hash_set<uint64_t> cached;
  IdealPrefixHits hits;
  for (const TraceRequest& r : trace) {
    ++hits.num_requests;
    hits.input_tokens += r.prompt_len;
    const int64_t full_blocks = r.prompt_len / block_size;
    const int64_t max_hit_blocks = (r.prompt_len - 1) / block_size;
    uint64_t chain = 0x6b767061676500ULL;  // "kvpage": a fixed non-zero root
    bool matching = true;
    // The tokens are generated as AppendPromptTokens does, one at a time, never stored: a
    // prompt may be 2^31 - 1 tokens long.
    const uint64_t vocab = static_cast<uint64_t>(r.vocab_size);
    int64_t b = 0;
    int32_t in_block = 0;
    for (const PromptSegment& seg : r.segments) {
      uint64_t state = seg.key;
      for (int32_t j = 0; j < seg.length && b < full_blocks; ++j) {
        state += kSplitMix64Gamma;
        const int32_t token = static_cast<int32_t>(SplitMix64Finalize(state) % vocab);
        chain = SplitMix64Finalize(chain ^ static_cast<uint32_t>(token));
        if (++in_block < block_size) continue;
        in_block = 0;
        const bool seen = !cached.insert(chain).second;
        if (matching && seen && b < max_hit_blocks) {
          hits.hit_tokens += block_size;
        } else {
          matching = false;
        }
        ++b;
      }
    }
  }
  return hits;
}

}  // namespace kvpage::sim
