// The --batch of `kvpage cost`: "CTX:NEW[,CTX:NEW…]", one request per entry (internal).
#ifndef KVPAGE_CLI_COST_BATCH_H_
#define KVPAGE_CLI_COST_BATCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "sim/cost_model.h"

namespace kvpage::cli {

// One request per comma-separated "CONTEXT:NEW_TOKENS" entry: CONTEXT a token count or 0,
// NEW_TOKENS a token count up to 2^30 (both accept the K/M suffixes). InvalidArgument naming
// the entry or the value otherwise, and for an empty text.
absl::StatusOr<sim::StepShape> ParseCostBatch(const std::string& text);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_COST_BATCH_H_
