// Token-id checks shared by the KV cache manager and the scheduler (internal).
#ifndef KVPAGE_INTERNAL_TOKEN_IDS_H_
#define KVPAGE_INTERNAL_TOKEN_IDS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvpage::internal {

// A token id outside [0, limit): negative, or not below the model's vocab_size. One unsigned
// compare covers both.
inline bool BadToken(int32_t token, uint32_t limit) {
  return static_cast<uint32_t>(token) >= limit;
}

// Why `token` is bad, for an error message.
inline std::string DescribeBadToken(int32_t token, uint32_t limit) {
  return token < 0 ? absl::StrCat("token id ", token, " is negative")
                   : absl::StrCat("token id ", token, " is not below the model's vocab_size ",
                                  limit);
}

}  // namespace kvpage::internal

#endif  // KVPAGE_INTERNAL_TOKEN_IDS_H_
