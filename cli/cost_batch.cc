// `kvpage cost --batch`: parsing the batch (cli/cost_batch.h).
#include "cli/cost_batch.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"

namespace kvpage::cli {

// "CTX:NEW,…" with CTX >= 0 and NEW >= 1 (token counts accept the K/M suffixes).
absl::StatusOr<sim::StepShape> ParseCostBatch(const std::string& text) {
  sim::StepShape step;
  if (text.empty()) return absl::InvalidArgumentError("--batch is required");
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    std::vector<std::string> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--batch: expected CONTEXT:NEW_TOKENS such as 2048:1, got '", entry, "'"));
    }
    int64_t ctx = 0, n = 0;
    if (parts[0] != "0") {
      if (absl::Status s = ParseTokenCount("batch context", parts[0], &ctx); !s.ok()) return s;
    }
    if (absl::Status s = ParseTokenCount("batch new tokens", parts[1], &n); !s.ok()) return s;
    if (n > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch: at most 2^30 new tokens per request, got ", n));
    }
    step.requests.push_back({ctx, static_cast<int32_t>(n)});
  }
  return step;
}

}  // namespace kvpage::cli
