// Fuzzes the hardware-file reader (ParseGpuSpec): a GPU either parses with positive memory,
// bandwidth and bf16 peak and efficiency factors in (0, 1], or is refused with a message.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "kvpage/catalog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const auto gpu = kvpage::ParseGpuSpec(text, "fuzz/gpu.json");
  if (!gpu.ok()) {
    kvpage::fuzz::CheckError(gpu.status());
    return 0;
  }
  KVPAGE_FUZZ_CHECK(gpu->memory_bytes > 0);
  KVPAGE_FUZZ_CHECK(gpu->hbm_bandwidth_bytes_per_s > 0);
  KVPAGE_FUZZ_CHECK(std::isfinite(gpu->roofline.mfu) && std::isfinite(gpu->roofline.hbm_efficiency));
  KVPAGE_FUZZ_CHECK(std::isfinite(gpu->roofline.step_overhead_s) &&
                    gpu->roofline.step_overhead_s >= 0);
  return 0;
}
