// `kvpage cost`: the predicted time of one forward step and its terms, from the same cost
// model `kvpage sim` advances its clock with.
#include <iostream>
#include <memory>
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

}  // namespace

int RunCost(const std::vector<std::string>& args) {
  CostFlags f;
  FlagSet fs(kCostUsage);
  fs.String("model", &f.model, "bundled model name or path to a config.json (required)");
  fs.String("gpu", &f.gpu, "bundled GPU (" + absl::StrJoin(BundledGpuAliases(), ", ") +
                                ") or path to a hardware JSON (required)");
  fs.String("batch", &f.batch, "CTX:NEW per request, comma-separated (required)");
  fs.Int("tp", &f.tp, "tensor-parallel degree; the calibration lists the profiled ones (default 1)");
  fs.String("format", &f.format, "text or json (default text)");
  fs.String("cost-model", &f.cost_model,
            "auto (calibrated when the GPU file has a calibration), calibrated or roofline");
  if (int rc = 0; !ParseFlagsOrExit(fs, args, "cost", &rc)) return rc;
  if (f.model.empty()) return Fail(absl::InvalidArgumentError("--model is required"));
  if (f.gpu.empty()) return Fail(absl::InvalidArgumentError("--gpu is required"));
  if (f.format != "text" && f.format != "json") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--format must be text or json, got '", f.format, "'")));
  }
  if (f.cost_model != "auto" && f.cost_model != "calibrated" && f.cost_model != "roofline") {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--cost-model must be auto, calibrated or roofline, got '", f.cost_model, "'")));
  }
  if (f.tp < 1 || f.tp > 1024) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--tp must be in [1, 1024], got ", f.tp)));
  }
  auto step = ParseCostBatch(f.batch);
  if (!step.ok()) return Fail(step.status());
  auto model = LoadModel(f.model);
  if (!model.ok()) return Fail(model.status());
  auto gpu = LoadGpu(f.gpu);
  if (!gpu.ok()) return Fail(gpu.status());
  sim::RooflineOptions options;
  options.tp = static_cast<int32_t>(f.tp);

  absl::StatusOr<sim::GpuCalibration> cal = absl::NotFoundError("not asked for");
  if (f.cost_model != "roofline") {
    cal = sim::LoadGpuCalibration(f.gpu);
    if (!cal.ok() && (f.cost_model == "calibrated" || !absl::IsNotFound(cal.status()))) {
      return Fail(cal.status());
    }
  }
  const std::string header_base =
      absl::StrFormat("%s on %s, tp %d: %d request%s, %d new token%s\n", model->name,
                      gpu->name, f.tp, step->requests.size(),
                      step->requests.size() == 1 ? "" : "s", step->NumNewTokens(),
                      step->NumNewTokens() == 1 ? "" : "s");
  if (cal.ok()) {
    auto m = sim::CalibratedCostModel::Create(*model, *gpu, *cal, options);
    if (!m.ok()) return Fail(m.status());
    const sim::CalibratedStepCost c = (*m)->Cost(*step);
    const std::vector<Term> terms = {{"linear", c.linear_s},     {"lm_head", c.lm_head_s},
                                     {"attention", c.attention_s}, {"small_ops", c.small_ops_s},
                                     {"all_reduce", c.all_reduce_s}};
    if (f.format == "json") {
      PrintJson(f, gpu->name, "calibrated", *step, terms, c.total_s,
                {{"gemm_efficiency", c.gemm_efficiency}, {"mfu", c.mfu}, {"flops", c.flops},
                 {"bytes", c.bytes}});
    } else {
      PrintText(absl::StrCat(header_base, "cost model: calibrated (", cal->source, ")\n"), terms,
                c.total_s,
                absl::StrFormat("GEMM efficiency at %d tokens %.3f; step MFU %.3f; %.4g FLOP and "
                                "%.4g bytes per GPU\n",
                                step->NumNewTokens(), c.gemm_efficiency, c.mfu, c.flops, c.bytes));
    }
    return 0;
  }
  auto m = sim::RooflineCostModel::Create(*model, *gpu, options);
  if (!m.ok()) return Fail(m.status());
  const sim::StepCost c = (*m)->Cost(*step);
  const std::vector<Term> terms = {
      {"compute", c.compute_s}, {"memory", c.memory_s}, {"overhead", c.overhead_s}};
  if (f.format == "json") {
    PrintJson(f, gpu->name, "roofline", *step, terms, c.total_s,
              {{"flops", c.flops}, {"bytes", c.bytes}});
  } else {
    PrintText(absl::StrCat(header_base,
                           "cost model: roofline, total = max(compute, memory) + overhead\n"),
              terms, c.total_s,
              absl::StrFormat("%.4g FLOP and %.4g bytes per GPU\n", c.flops, c.bytes));
  }
  return 0;
}

}  // namespace kvpage::cli
