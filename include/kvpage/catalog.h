// Model configs and GPU specs bundled with kvpage, and lookup by name or path.
//
// The bundled files (sim/data/models/*.json, sim/data/hardware/*.json) are compiled into the
// library, so a binary needs no data directory. Thread-safe: all functions are pure reads.
#ifndef KVPAGE_CATALOG_H_
#define KVPAGE_CATALOG_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "kvpage/model_spec.h"

namespace kvpage {

// Names of the bundled model configs, sorted ("deepseek-v2-lite", "qwen3-8b", …).
std::vector<std::string> BundledModelNames();

// A bundled name, or else a path to a config.json. NotFound (listing the bundled names) when
// it is neither; InvalidArgument when the config is malformed.
absl::StatusOr<ModelSpec> LoadModel(absl::string_view name_or_path);

// How close a step gets to the datasheet peaks, and the fixed costs around it: the simulator's
// roofline cost model reads these (JSON object "roofline"; every field optional). The defaults
// are the ideal roofline — full peak, full bandwidth, no overhead — so a hardware file without
// the object gives a speed-of-light bound.
struct RooflineFactors {
  double mfu = 1.0;                  // achieved / peak dense FLOP/s for matmul and attention
  double hbm_efficiency = 1.0;       // achieved / peak HBM bandwidth
  double step_overhead_s = 0.0;      // per forward step (launch, scheduling, sampling)
  double layer_overhead_s = 0.0;     // per decoder layer per step
  double request_overhead_s = 0.0;   // per scheduled request per step
};

// One GPU's capacity and speed figures, from a hardware data file (units in the field names).
struct GpuSpec {
  std::string name;                  // e.g. "H100-SXM5-80GB"
  std::vector<std::string> aliases;  // e.g. {"h100", "h100-sxm"}
  int64_t memory_bytes = 0;          // total device memory as nvidia-smi reports it
  int64_t hbm_bandwidth_bytes_per_s = 0;
  int64_t peak_dense_flops_bf16 = 0;
  int64_t peak_dense_flops_fp16 = 0;
  int64_t peak_dense_flops_fp8 = 0;  // 0 when the GPU has no fp8 tensor cores
  RooflineFactors roofline;
};

// Names of the bundled GPUs' files, sorted ("a100-sxm-80gb", "b200-sxm", ...).
std::vector<std::string> BundledGpuNames();

// The first alias of each bundled GPU (its file name when it has none), sorted: the short
// names help texts and error messages list ("a100", "b200", "gb200", ...).
std::vector<std::string> BundledGpuAliases();

// Looks up a bundled GPU by file name, name or alias (case-insensitive), else reads `name` as a
// path to a hardware JSON file. NotFound when neither; InvalidArgument naming the field when a
// file is malformed.
absl::StatusOr<GpuSpec> LoadGpu(absl::string_view name_or_path);

// Parses one hardware JSON document; `source` names it in errors.
absl::StatusOr<GpuSpec> ParseGpuSpec(absl::string_view json_text, absl::string_view source);

}  // namespace kvpage

#endif  // KVPAGE_CATALOG_H_
