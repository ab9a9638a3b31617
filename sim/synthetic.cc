// The synthetic trace generator declared in sim/trace.h.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "sim/random.h"
#include "sim/trace.h"

namespace kvpage::sim {
namespace {

int32_t Draw(const LengthDistribution& d, SplitMix64* rng) {
  double v = d.a;
  switch (d.kind) {
    case LengthDistribution::Kind::kFixed:
      break;
    case LengthDistribution::Kind::kUniform:
      v = static_cast<double>(rng->UniformInt(static_cast<int64_t>(std::llround(d.a)),
                                              static_cast<int64_t>(std::llround(d.b))));
      break;
    case LengthDistribution::Kind::kLogNormal:
      v = d.a * std::exp(d.b * rng->Normal());
      break;
  }
  const double clamped = std::clamp(std::round(v), static_cast<double>(d.min),
                                    static_cast<double>(d.max));
  return static_cast<int32_t>(clamped);
}

}  // namespace

absl::Status LengthDistribution::Validate(absl::string_view what) const {
  auto error = [&](absl::string_view msg) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", msg));
  };
  if (min < 1 || max < min) {
    return error(absl::StrCat("need 1 <= min <= max, got min ", min, ", max ", max));
  }
  if (!std::isfinite(a) || !std::isfinite(b)) return error("parameters must be finite");
  switch (kind) {
    case Kind::kFixed:
      if (a < 1) return error(absl::StrCat("fixed length must be >= 1, got ", a));
      break;
    case Kind::kUniform:
      if (a < 0 || b < a || b > 2147483647.0) {
        return error(absl::StrCat("uniform range needs 0 <= a <= b, got [", a, ", ", b, "]"));
      }
      break;
    case Kind::kLogNormal:
      if (a <= 0 || b < 0) {
        return error(absl::StrCat("log-normal needs median > 0 and sigma >= 0, got ", a, ", ",
                                  b));
      }
      break;
  }
  return absl::OkStatus();
}

absl::Status SyntheticTraceOptions::Validate() const {
  if (num_requests < 1 || num_requests > kMaxSyntheticRequests) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_requests must be in [1, ", kMaxSyntheticRequests, "], got ", num_requests,
        " (every request and its record stay in memory for the whole run)"));
  }
  KVPAGE_RETURN_IF_ERROR(arrival.Validate());
  KVPAGE_RETURN_IF_ERROR(prompt_len.Validate("prompt_len"));
  KVPAGE_RETURN_IF_ERROR(output_len.Validate("output_len"));
  if (!(shared_prefix_fraction >= 0 && shared_prefix_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared_prefix_fraction must be in [0, 1], got ", shared_prefix_fraction));
  }
  if (num_prefix_groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_prefix_groups must be >= 1, got ", num_prefix_groups));
  }
  if (vocab_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 2, got ", vocab_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TraceRequest>> GenerateSyntheticTrace(
    const SyntheticTraceOptions& options) {
  KVPAGE_RETURN_IF_ERROR(options.Validate());
  // Separate streams for lengths and groups, so changing one distribution leaves the others'
  // draws unchanged.
  SplitMix64 prompt_rng(StreamKey(options.seed, StreamKind::kPrefixGroup, ~0ULL));
  SplitMix64 output_rng(StreamKey(options.seed, StreamKind::kPrefixGroup, ~1ULL));
  SplitMix64 group_rng(StreamKey(options.seed, StreamKind::kPrefixGroup, ~2ULL));
  ArrivalClock clock(options.arrival, options.seed);
  std::vector<TraceRequest> out;
  out.reserve(static_cast<size_t>(options.num_requests));
  for (int64_t i = 0; i < options.num_requests; ++i) {
    TraceRequest r;
    r.index = i;
    r.arrival_s = clock.Next();
    r.prompt_len = Draw(options.prompt_len, &prompt_rng);
    r.output_len = Draw(options.output_len, &output_rng);
    r.vocab_size = options.vocab_size;
    const int64_t group = group_rng.UniformInt(0, options.num_prefix_groups - 1);
    const auto shared = static_cast<int32_t>(
        std::floor(options.shared_prefix_fraction * static_cast<double>(r.prompt_len)));
    if (shared > 0) {
      r.segments.push_back(
          {StreamKey(options.seed, StreamKind::kPrefixGroup, static_cast<uint64_t>(group)),
           shared});
    }
    if (r.prompt_len > shared) {
      r.segments.push_back(
          {StreamKey(options.seed, StreamKind::kRequestUnique, static_cast<uint64_t>(i)),
           r.prompt_len - shared});
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvpage::sim
