// Measured speed curves of one GPU, fitted to per-operation profiles, that the calibrated cost
// model (sim/cost_model.h) reads.
//
// A hardware JSON file (sim/data/hardware/*.json) may carry a "calibration" object next to
// its datasheet figures. scripts/fit_cost_model.py writes it from profiles in the Vidur
// profiler's layout; sim/data/hardware/README.md lists every field and its unit, and
// docs/simulator.md says how the curves were fitted and how well they predict held-out models.
//
// GpuCalibration is a plain value, immutable once parsed; safe to share across threads.
#ifndef KVPAGE_SIM_HARDWARE_CALIBRATION_H_
#define KVPAGE_SIM_HARDWARE_CALIBRATION_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "kvpage/catalog.h"

namespace kvpage::sim {

// Linear layers at one tensor-parallel degree: a GEMM of M = `tokens` rows against a K × N
// weight of W bytes (per GPU) takes
//   launch_s + max(W / (bandwidth · hbm_efficiency), Q · 2 · M · N · K / (peak · efficiency)),
// Q the tile quantization below (1 when the calibration has none).
struct GemmCurve {
  int32_t tp = 1;
  double launch_s = 0;        // per GEMM kernel
  double hbm_efficiency = 1;  // achieved / datasheet bandwidth when streaming weights
  // Achieved / datasheet FLOP/s at each profiled token count (increasing, >= 1).
  std::vector<double> tokens;
  std::vector<double> efficiency;

  // Linear in log2(tokens) between the listed counts, clamped outside them.
  double EfficiencyAt(double num_tokens) const;
};

// How a GEMM's output tiles fill the GPU: the M × N output is cut into tm × tn tiles, each
// optionally split along K into s slices (split-K, s = 1 .. split_k), that run in waves of
// `sm_count`, each slice over K' = ceil(K / s) rounded up to `k_multiple`; the library is taken
// to run the tile and split that waste least. Q = min over tiles and s of
//   ceil(s · G · ceil(M / tm) · ceil(N / tn) / sm_count) · sm_count · tm · tn · K' / (G · M · N · K)
// >= 1, for G same-shape GEMMs launched together (the experts of a MoE layer; 1 otherwise).
struct TileQuantization {
  int32_t sm_count = 1;
  std::vector<std::pair<int32_t, int32_t>> tiles;  // (tm, tn), non-empty
  int32_t k_multiple = 1;
  int32_t split_k = 1;  // most K slices per tile; 1: no split-K

  // Q for `groups` M × K by K × N products (M, N, K > 0; fractions are rounded up to whole
  // tiles).
  double Factor(double m, double n, double k, double groups = 1) const;
};

// A small kernel (norm, rope, activation, residual add, embedding):
// launch_s + seconds_per_element · elements, elements = tokens · hidden_size, divided by tp
// when `split_by_tp`.
struct SmallOpCost {
  std::string op;             // the profile's name, e.g. "input_layernorm"
  bool split_by_tp = false;   // width "hidden_per_tp" (else "hidden")
  bool per_step = false;      // "step": once per step (embedding); else once per layer
  double launch_s = 0;
  double seconds_per_element = 0;
};

// Measured all-reduce medians on one node of `tp` GPUs against message size.
struct AllReduceTable {
  int32_t tp = 2;
  std::vector<double> bytes;    // increasing
  std::vector<double> seconds;  // non-decreasing

  // Log-log interpolation; the first time below the smallest size, linear in bytes past
  // the largest.
  double SecondsFor(double message_bytes) const;
};

struct GpuCalibration {
  std::string source;                 // where it was read from, for messages
  std::vector<GemmCurve> gemm;        // increasing tp
  std::vector<SmallOpCost> small_ops;
  std::vector<AllReduceTable> all_reduce;  // increasing tp
  // Tile quantization of the linear layers ("tiles"); absent when not fitted with one.
  absl::optional<TileQuantization> tiles;
  // First-principles attention (no profiles): prefill FLOPs run at this fraction of peak.
  // Decode KV reads use the GEMM curve's hbm_efficiency.
  double attention_prefill_efficiency = 1;

  // The curve and table for `tp`; nullptr when it was not profiled.
  const GemmCurve* GemmFor(int32_t tp) const;
  const AllReduceTable* AllReduceFor(int32_t tp) const;
  // Tensor-parallel degrees with a GEMM curve (and, above 1, an all-reduce table).
  std::vector<int32_t> ProfiledTp() const;
};

// Parses the "calibration" object of a hardware JSON document. NotFound when the document has
// none; InvalidArgument naming `source` and the field when it is malformed.
absl::StatusOr<GpuCalibration> ParseGpuCalibration(absl::string_view json_text,
                                                   absl::string_view source);

// The calibration of a bundled GPU, matched by `gpu.name`; NotFound when that GPU has none.
absl::StatusOr<GpuCalibration> BundledCalibration(const GpuSpec& gpu);

// A bundled GPU by file name, name or alias (as LoadGpu matches them), else a path to a
// hardware JSON file. NotFound when neither, or when the file has no calibration.
absl::StatusOr<GpuCalibration> LoadGpuCalibration(absl::string_view name_or_path);

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_HARDWARE_CALIBRATION_H_
