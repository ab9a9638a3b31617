// `kvpage cost`: the predicted time of one forward step and its terms, from the same cost
// model `kvpage sim` advances its clock with.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli_util.h"
#include "cli/cost_batch.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "kvpage/catalog.h"
#include "sim/calibrated_cost_model.h"
#include "sim/cost_model.h"
#include "sim/hardware_calibration.h"

namespace kvpage::cli {
namespace {

constexpr const char* kCostUsage =
    R"(Usage: kvpage cost --model M --gpu G --batch CTX:NEW[,CTX:NEW…] [flags]

Predicts how long one forward step takes and prints its terms. Each request in --batch has
CTX tokens already in the KV cache and computes NEW tokens this step: "1024:512" is a prefill
chunk of 512 after 1,024 cached tokens, "2048:1" one decode step at context 2,048.
The calibrated model (docs/simulator.md) is used when the GPU's hardware file has a
"calibration" object (bundled A100, H100, H200), otherwise the roofline.

Example: kvpage cost --model llama-3.1-8b --gpu a100 --batch 1024:512,2048:1,2048:1

Flags:
)";

struct CostFlags {
  std::string model;
  std::string gpu;
  std::string batch;
  int64_t tp = 1;
  std::string format = "text";
  std::string cost_model = "auto";
};

struct Term {
  const char* name;
  double seconds;
};

void PrintText(const std::string& header, const std::vector<Term>& terms, double total_s,
               const std::string& footer) {
  std::cout << header;
  std::cout << absl::StrFormat("%-12s %12s %7s\n", "term", "time (ms)", "share");
  for (const Term& t : terms) {
    std::cout << absl::StrFormat("%-12s %12.4f %6.1f%%\n", t.name, t.seconds * 1e3,
                                 total_s > 0 ? 100.0 * t.seconds / total_s : 0.0);
  }
  std::cout << absl::StrFormat("%-12s %12.4f\n", "total", total_s * 1e3) << footer;
}

void PrintJson(const CostFlags& f, const std::string& gpu_name, const std::string& model_kind,
               const sim::StepShape& step, const std::vector<Term>& terms, double total_s,
               const std::vector<Term>& extras) {
  std::vector<std::string> reqs, parts;
  for (const sim::ScheduledRequest& r : step.requests) {
    reqs.push_back(absl::StrFormat(R"({"context": %d, "new_tokens": %d})",
                                   r.num_computed_tokens, r.num_new_tokens));
  }
  for (const Term& t : terms) parts.push_back(absl::StrFormat(R"("%s": %.9g)", t.name, t.seconds));
  std::cout << "{\n"
            << absl::StrFormat(R"(  "model": "%s", "gpu": "%s", "tp": %d, "cost_model": "%s",)",
                               f.model, gpu_name, f.tp, model_kind)
            << "\n  \"requests\": [" << absl::StrJoin(reqs, ", ") << "],\n"
            << absl::StrFormat("  \"new_tokens\": %d,\n", step.NumNewTokens())
            << "  \"terms_s\": {" << absl::StrJoin(parts, ", ") << "},\n";
  for (const Term& e : extras) std::cout << absl::StrFormat("  \"%s\": %.9g,\n", e.name, e.seconds);
  std::cout << absl::StrFormat("  \"total_s\": %.9g\n}\n", total_s);
}

int Fail(const absl::Status& status) {
  std::cerr << "kvpage cost: " << status.message() << "\n";
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? 2 : 1;
}

void RegisterCostFlags(FlagSet& fs, CostFlags& f) {
  fs.String("model", &f.model, "bundled model name or path to a config.json (required)");
  fs.String("gpu", &f.gpu, "bundled GPU (" + absl::StrJoin(BundledGpuAliases(), ", ") +
                                ") or path to a hardware JSON (required)");
  fs.String("batch", &f.batch, "CTX:NEW per request, comma-separated (required)");
  fs.Int("tp", &f.tp, "tensor-parallel degree; the calibration lists the profiled ones (default 1)");
  fs.String("format", &f.format, "text or json (default text)");
  fs.String("cost-model", &f.cost_model,
            "auto (calibrated when the GPU file has a calibration), calibrated or roofline");
}

// The flags' own values, before any file is read; InvalidArgument naming the bad one.
absl::Status CheckCostFlags(const CostFlags& f) {
  if (f.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (f.gpu.empty()) return absl::InvalidArgumentError("--gpu is required");
  if (f.format != "text" && f.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json, got '", f.format, "'"));
  }
  if (f.cost_model != "auto" && f.cost_model != "calibrated" && f.cost_model != "roofline") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cost-model must be auto, calibrated or roofline, got '", f.cost_model, "'"));
  }
  if (f.tp < 1 || f.tp > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--tp must be in [1, 1024], got ", f.tp));
  }
  return absl::OkStatus();
}

// The calibration of --gpu, or nullopt for the roofline (--cost-model roofline, or auto and
// the GPU file has none). An error when --cost-model calibrated finds none, or the file's
// calibration is broken.
absl::StatusOr<std::optional<sim::GpuCalibration>> Calibration(const CostFlags& f) {
  if (f.cost_model == "roofline") return std::optional<sim::GpuCalibration>();
  absl::StatusOr<sim::GpuCalibration> cal = sim::LoadGpuCalibration(f.gpu);
  if (cal.ok()) return std::optional<sim::GpuCalibration>(*std::move(cal));
  if (f.cost_model == "calibrated" || !absl::IsNotFound(cal.status())) return cal.status();
  return std::optional<sim::GpuCalibration>();
}

// What every step the command prices shares: the model, the GPU and the batch.
struct CostInputs {
  ModelSpec model;
  GpuSpec gpu;
  sim::StepShape step;
  sim::RooflineOptions options;
  std::string header;  // "<model> on <gpu>, tp T: N requests, M new tokens\n"
};

absl::StatusOr<CostInputs> LoadCostInputs(const CostFlags& f) {
  CostInputs in;
  auto step = ParseCostBatch(f.batch);
  if (!step.ok()) return step.status();
  in.step = *std::move(step);
  auto model = LoadModel(f.model);
  if (!model.ok()) return model.status();
  in.model = *std::move(model);
  auto gpu = LoadGpu(f.gpu);
  if (!gpu.ok()) return gpu.status();
  in.gpu = *std::move(gpu);
  in.options.tp = static_cast<int32_t>(f.tp);
  const size_t requests = in.step.requests.size();
  const int64_t new_tokens = in.step.NumNewTokens();
  in.header = absl::StrFormat("%s on %s, tp %d: %d request%s, %d new token%s\n", in.model.name,
                              in.gpu.name, f.tp, requests, requests == 1 ? "" : "s", new_tokens,
                              new_tokens == 1 ? "" : "s");
  return in;
}

int PrintCalibrated(const CostFlags& f, const CostInputs& in, const sim::GpuCalibration& cal) {
  auto m = sim::CalibratedCostModel::Create(in.model, in.gpu, cal, in.options);
  if (!m.ok()) return Fail(m.status());
  const sim::CalibratedStepCost c = (*m)->Cost(in.step);
  std::vector<Term> terms = {{"linear", c.linear_s}, {"lm_head", c.lm_head_s},
                             {"attention", c.attention_s}};
  // Only a model with sparse attention (DeepSeek-V3.2) has a lightning indexer to price.
  if (in.model.index_topk > 0) terms.push_back({"indexer", c.indexer_s});
  terms.insert(terms.end(), {{"small_ops", c.small_ops_s}, {"all_reduce", c.all_reduce_s}});
  if (f.format == "json") {
    PrintJson(f, in.gpu.name, "calibrated", in.step, terms, c.total_s,
              {{"gemm_efficiency", c.gemm_efficiency}, {"mfu", c.mfu}, {"flops", c.flops},
               {"bytes", c.bytes}});
  } else {
    PrintText(absl::StrCat(in.header, "cost model: calibrated (", cal.source, ")\n"), terms,
              c.total_s,
              absl::StrFormat("GEMM efficiency at %d tokens %.3f; step MFU %.3f; %.4g FLOP and "
                              "%.4g bytes per GPU\n",
                              in.step.NumNewTokens(), c.gemm_efficiency, c.mfu, c.flops, c.bytes));
  }
  return 0;
}

int PrintRoofline(const CostFlags& f, const CostInputs& in) {
  auto m = sim::RooflineCostModel::Create(in.model, in.gpu, in.options);
  if (!m.ok()) return Fail(m.status());
  const sim::StepCost c = (*m)->Cost(in.step);
  const std::vector<Term> terms = {
      {"compute", c.compute_s}, {"memory", c.memory_s}, {"overhead", c.overhead_s}};
  if (f.format == "json") {
    PrintJson(f, in.gpu.name, "roofline", in.step, terms, c.total_s,
              {{"flops", c.flops}, {"bytes", c.bytes}});
  } else {
    PrintText(absl::StrCat(in.header,
                           "cost model: roofline, total = max(compute, memory) + overhead\n"),
              terms, c.total_s,
              absl::StrFormat("%.4g FLOP and %.4g bytes per GPU\n", c.flops, c.bytes));
  }
  return 0;
}

}  // namespace

int RunCost(const std::vector<std::string>& args) {
  CostFlags f;
  FlagSet fs(kCostUsage);
  RegisterCostFlags(fs, f);
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "cost", &rc)) return rc;
  if (absl::Status s = CheckCostFlags(f); !s.ok()) return Fail(s);
  auto inputs = LoadCostInputs(f);
  if (!inputs.ok()) return Fail(inputs.status());
  auto cal = Calibration(f);
  if (!cal.ok()) return Fail(cal.status());
  return cal->has_value() ? PrintCalibrated(f, *inputs, **cal) : PrintRoofline(f, *inputs);
}

}  // namespace kvpage::cli
