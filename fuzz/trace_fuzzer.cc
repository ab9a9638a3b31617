// Fuzzes one trace reader (KVPAGE_FUZZ_TRACE_FORMAT: mooncake, azure or lengths): any text
// either parses into requests that keep the TraceRequest contract or is refused with a
// message naming the source. The prompts are checked from their segments, never built: a
// row may describe 2^31 - 1 tokens, and reading it must not cost their memory.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "sim/trace.h"

#ifndef KVPAGE_FUZZ_TRACE_FORMAT
#error "define KVPAGE_FUZZ_TRACE_FORMAT (mooncake, azure or lengths)"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace sim = kvpage::sim;
  static const sim::TraceFormat format = *sim::ParseTraceFormat(KVPAGE_FUZZ_TRACE_FORMAT);
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  sim::TraceOptions options;
  options.seed = 7;
  options.arrival.kind = sim::ArrivalKind::kPoisson;
  options.arrival.rate_per_s = 4.0;
  const auto trace = sim::ParseTrace(format, text, "fuzz-trace", options);
  if (!trace.ok()) {
    kvpage::fuzz::CheckError(trace.status());
    KVPAGE_FUZZ_CHECK(absl::StartsWith(trace.status().message(), "fuzz-trace"));
    return 0;
  }
  KVPAGE_FUZZ_CHECK(!trace->empty());
  double last_arrival = 0;
  for (size_t i = 0; i < trace->size(); ++i) {
    const sim::TraceRequest& r = (*trace)[i];
    KVPAGE_FUZZ_CHECK(r.index == static_cast<int64_t>(i));
    KVPAGE_FUZZ_CHECK(std::isfinite(r.arrival_s) && r.arrival_s >= 0);
    KVPAGE_FUZZ_CHECK(r.arrival_s >= last_arrival);
    last_arrival = r.arrival_s;
    KVPAGE_FUZZ_CHECK(r.prompt_len >= 1 && r.output_len >= 1);
    KVPAGE_FUZZ_CHECK(r.vocab_size == options.vocab_size);
    int64_t covered = 0;
    for (const sim::PromptSegment& seg : r.segments) {
      KVPAGE_FUZZ_CHECK(seg.length >= 1);
      covered += seg.length;
    }
    KVPAGE_FUZZ_CHECK(covered == r.prompt_len);
  }
  return 0;
}
