// BlockHashExtras::Validate: multimodal items must lie within the prompt they describe, in
// order and apart.
#include "absl/strings/str_cat.h"
#include "kvpage/block_hash.h"

namespace kvpage {

absl::Status BlockHashExtras::Validate(int64_t num_prompt_tokens) const {
  for (size_t i = 0; i < mm_items.size(); ++i) {
    const MultimodalItem& item = mm_items[i];
    if (item.identifier.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("multimodal item ", i, " has an empty identifier"));
    }
    if (item.offset < 0 || item.offset >= num_prompt_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("multimodal item ", i, " ('", item.identifier, "') offset ", item.offset,
                       " is outside the prompt of ", num_prompt_tokens, " tokens"));
    }
    // Compared against what is left of the prompt, so that no sum overflows.
    if (item.length <= 0 || item.length > num_prompt_tokens - item.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multimodal item ", i, " ('", item.identifier, "') length ", item.length, " at offset ",
          item.offset, " does not fit in the prompt of ", num_prompt_tokens,
          " tokens (it must be positive and end by the prompt's end)"));
    }
    if (i > 0 && item.offset < mm_items[i - 1].offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("multimodal items are not sorted by offset: item ", i, " at ",
                       item.offset, " follows one at ", mm_items[i - 1].offset));
    }
    // (The previous item ends by the prompt's end, so its end does not overflow.)
    if (i > 0 && item.offset < mm_items[i - 1].offset + mm_items[i - 1].length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "multimodal item ", i, " ('", item.identifier, "') at offset ", item.offset,
          " overlaps item ", i - 1, " ('", mm_items[i - 1].identifier, "'), which ends at ",
          mm_items[i - 1].offset + mm_items[i - 1].length));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage
