// The pieces the trace readers of trace.h share: row errors and the Mooncake reader, which
// parses each JSON row as a stream of values and keeps only what a request needs.
//
// Thread-compatible. Errors name `source`, the 1-based line and the offending value.
#ifndef KVPAGE_SIM_TRACE_READERS_H_
#define KVPAGE_SIM_TRACE_READERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/trace.h"
#include "sim/trace_input.h"

namespace kvpage::sim {

// The most hash ids a Mooncake row needs: ceil((2^31 − 1) / 512). Ids past a row's
// ceil(input_length / 512) are dropped, so a row's kept ids never exceed this however long
// its list.
inline constexpr int64_t kMaxMooncakeHashIds =
    (int64_t{2147483647} + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;

// "<source>:<line>: <what>" as InvalidArgument.
absl::Status LineError(absl::string_view source, int64_t line, absl::string_view what);

// A token count in [1, INT32_MAX] from a CSV cell or a JSON number's text.
absl::StatusOr<int32_t> ParseCount(absl::string_view cell, absl::string_view field,
                                   absl::string_view source, int64_t line);

// Appends the Mooncake rows of `in` to *out until its end or options.max_requests requests
// (the rows after those are not read). Memory: the kept hash ids of one row plus
// nlohmann's buffer for one JSON token, at most kMaxJsonTokenBytes.
absl::Status ReadMooncake(TraceInput& in, absl::string_view source, const TraceOptions& options,
                          std::vector<TraceRequest>* out);

// The longest JSON token (a string or number, or a run of whitespace between two) a Mooncake
// row may hold: the parser keeps a token whole before handing it on.
inline constexpr int64_t kMaxJsonTokenBytes = int64_t{1} << 26;

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_TRACE_READERS_H_
