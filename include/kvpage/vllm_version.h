// Which vLLM release kvpage's vLLM emulation follows.
//
// The vllm planner policy and the vllm accounting mode of the KvCacheManager reproduce what one
// vLLM release reserves and allocates. Releases differ in a few rules (the hybrid block
// alignment, how many linear-attention state blocks a request's first step takes, the null
// block); docs/capacity_planning.md §3.2 lists each difference with the vLLM source it comes
// from. kCurrentVllmVersion is the default everywhere.
#ifndef KVPAGE_VLLM_VERSION_H_
#define KVPAGE_VLLM_VERSION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvpage {

enum class VllmVersion : uint8_t {
  kV0_29,  // the figures measured with vLLM 0.29.1rc1 (vllm.md §1.8)
  kV0_33,  // vLLM 0.33.0, the current release on PyPI
};

inline constexpr VllmVersion kCurrentVllmVersion = VllmVersion::kV0_33;

// "0.29" or "0.33".
absl::string_view VllmVersionName(VllmVersion version);
// Accepts "0.29", "0.33" (and a leading "v" or a patch level: "v0.33", "0.33.0").
// InvalidArgument naming the text otherwise.
absl::StatusOr<VllmVersion> ParseVllmVersion(absl::string_view text);
// InvalidArgument when `version` (say a cast integer) is not a VllmVersion.
absl::Status ValidateVllmVersion(VllmVersion version);
// InvalidArgument naming `block_size` unless vLLM accepts it (1, 8, 16, 32, 64 or 128).
absl::Status CheckVllmBlockSize(int64_t block_size);

}  // namespace kvpage

#endif  // KVPAGE_VLLM_VERSION_H_
