#include "kvpage/plan_format.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

nlohmann::ordered_json PlanJson(const Plan& plan) {
  nlohmann::ordered_json j;
  j["model"] = plan.model;
  j["policy"] = std::string(PolicyName(plan.policy));
  j["kv_cache_dtype"] = std::string(DTypeName(plan.kv_cache_dtype));
  if (plan.tp > 1) j["tp"] = plan.tp;  // absent at tp 1, as before tensor parallelism existed
  j["kv_budget_bytes"] = plan.kv_budget_bytes.has_value()
                             ? nlohmann::ordered_json(*plan.kv_budget_bytes)
                             : nlohmann::ordered_json(nullptr);
  if (plan.vllm_runtime.has_value()) {
    j["vllm_runtime"] = {{"activation_bytes", plan.vllm_runtime->activation_bytes},
                         {"cuda_graph_bytes", plan.vllm_runtime->cuda_graph_bytes},
                         {"non_torch_bytes", plan.vllm_runtime->non_torch_bytes}};
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const PlanRow& r : plan.rows) {
    nlohmann::ordered_json row;
    row["context"] = r.context;
    row["reserved_bytes"] = r.reserved_bytes;
    row["kv_bytes"] = r.kv_bytes;
    row["state_bytes"] = r.state_bytes;
    row["shared_bytes"] = r.shared_bytes;
    row["snapshot_bytes"] = r.snapshot_bytes;
    row["bytes_per_token"] = r.bytes_per_token;
    row["max_concurrency"] = r.max_concurrency.has_value()
                                 ? nlohmann::ordered_json(*r.max_concurrency)
                                 : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json groups = nlohmann::ordered_json::array();
    for (const GroupReservation& g : r.groups) {
      groups.push_back({{"kind", std::string(LayerKindName(g.kind))},
                        {"num_layers", g.num_layers},
                        {"padding_layers", g.padding_layers},
                        {"block_size", g.block_size},
                        {"blocks", g.blocks},
                        {"reserved_bytes", g.reserved_bytes}});
    }
    row["groups"] = std::move(groups);
    if (plan.policy == Policy::kVllm || !r.refusal.empty()) {
      row[plan.policy == Policy::kVllm ? "vllm_starts" : "llamacpp_starts"] = r.refusal.empty();
      if (!r.refusal.empty()) {
        row["refusal"] = r.refusal;
        row["fixes"] = r.fixes;
      }
    }
    rows.push_back(std::move(row));
  }
  j["rows"] = std::move(rows);
  return j;
}

std::string ContextLabel(int64_t context) {
  if (context % 1024 == 0) return absl::StrCat(context / 1024, "K");
  return absl::StrCat(context);
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.3f", bytes / kMiB); }

// One line per row vLLM (or llama.cpp) would refuse to start with: the reason and the fix.
void AppendRefusals(const Plan& plan, std::string& out) {
  for (const PlanRow& r : plan.rows) {
    if (r.refusal.empty()) continue;
    absl::StrAppend(&out, plan.policy == Policy::kLlamaCpp ? "llama.cpp" : "vLLM",
                    " would not start at ", ContextLabel(r.context), ": ", r.refusal,
                    ". Any one of these would let it: ", absl::StrJoin(r.fixes, "; "), ".\n");
  }
}

// The runtime memory a vllm plan's budget left out, when it came from a GPU.
void AppendVllmRuntime(const Plan& plan, std::string& out) {
  if (!plan.vllm_runtime.has_value() || !plan.kv_budget_bytes.has_value()) return;
  const VllmRuntimeMemory& m = *plan.vllm_runtime;
  absl::StrAppendFormat(&out,
                        "vLLM's budget %.2f GiB: the weights' remainder less its estimated "
                        "activations %.2f GiB, CUDA graphs %.2f GiB, non-torch %.2f GiB.\n",
                        *plan.kv_budget_bytes / kGiB, m.activation_bytes / kGiB,
                        m.cuda_graph_bytes / kGiB, m.non_torch_bytes / kGiB);
}

// The CSV's vllm_starts and vllm_refusal cells: empty under other policies; the refusal
// quoted, its quotes doubled (RFC 4180).
std::string VllmStartCells(const Plan& plan, const PlanRow& r) {
  if (plan.policy != Policy::kVllm) return ",";
  if (r.refusal.empty()) return "true,";
  return absl::StrCat("false,\"", absl::StrReplaceAll(r.refusal, {{"\"", "\"\""}}), "\"");
}

}  // namespace

std::string PlansToJson(absl::Span<const Plan> plans) {
  if (plans.size() == 1) return PlanJson(plans[0]).dump(2) + "\n";
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const Plan& p : plans) all.push_back(PlanJson(p));
  nlohmann::ordered_json root;
  root["plans"] = std::move(all);
  return root.dump(2) + "\n";
}

std::string PlansToCsv(absl::Span<const Plan> plans) {
  std::string out =
      "model,policy,kv_cache_dtype,context,reserved_bytes,kv_bytes,state_bytes,shared_bytes,"
      "snapshot_bytes,bytes_per_token,max_concurrency,vllm_starts,vllm_refusal\n";
  for (const Plan& p : plans) {
    for (const PlanRow& r : p.rows) {
      absl::StrAppend(&out, p.model, ",", PolicyName(p.policy), ",", DTypeName(p.kv_cache_dtype),
                      ",", r.context, ",", r.reserved_bytes, ",", r.kv_bytes, ",", r.state_bytes,
                      ",", r.shared_bytes, ",", r.snapshot_bytes, ",",
                      absl::StrFormat("%.3f", r.bytes_per_token), ",",
                      r.max_concurrency.has_value() ? absl::StrCat(*r.max_concurrency) : "",
                      ",", VllmStartCells(p, r), "\n");
    }
  }
  return out;
}

std::string PlanToTable(const Plan& plan) {
  std::string out = absl::StrFormat("%s  policy %s  kv dtype %s", plan.model,
                                    PolicyName(plan.policy), DTypeName(plan.kv_cache_dtype));
  if (plan.tp > 1) absl::StrAppendFormat(&out, "  tp %d (per GPU)", plan.tp);
  if (plan.kv_budget_bytes.has_value()) {
    absl::StrAppendFormat(&out, "  budget %.2f GiB", *plan.kv_budget_bytes / kGiB);
  }
  absl::StrAppend(&out, "\n");
  absl::StrAppendFormat(&out, "%8s %14s %14s %12s %12s %12s %11s\n", "context", "reserved MiB",
                        "kv MiB", "state MiB", "shared MiB", "bytes/token", "max concur");
  for (const PlanRow& r : plan.rows) {
    absl::StrAppendFormat(&out, "%8s %14s %14s %12s %12s %12.1f %11s\n", ContextLabel(r.context),
                          MiB(r.reserved_bytes), MiB(r.kv_bytes), MiB(r.state_bytes),
                          MiB(r.shared_bytes), r.bytes_per_token,
                          r.max_concurrency.has_value() ? absl::StrCat(*r.max_concurrency) : "-");
  }
  AppendVllmRuntime(plan, out);
  AppendRefusals(plan, out);
  return out;
}

std::string CompareTable(absl::Span<const Plan> plans) {
  if (plans.empty()) return "";
  std::vector<std::string> dtypes;
  for (const Plan& p : plans) {
    dtypes.push_back(absl::StrCat(PolicyName(p.policy), " ", DTypeName(p.kv_cache_dtype)));
  }
  std::string out = absl::StrCat(plans[0].model, "  (", absl::StrJoin(dtypes, ", "), ")");
  if (plans[0].tp > 1) absl::StrAppendFormat(&out, "  tp %d (per GPU)", plans[0].tp);
  if (plans[0].kv_budget_bytes.has_value()) {
    absl::StrAppendFormat(&out, "  budget %.2f GiB", *plans[0].kv_budget_bytes / kGiB);
  }
  absl::StrAppend(&out, "\n", absl::StrFormat("%8s", "context"));
  for (const Plan& p : plans) absl::StrAppendFormat(&out, " %16s", absl::StrCat(PolicyName(p.policy), " MiB"));
  const bool budget = plans[0].kv_budget_bytes.has_value();
  if (budget) {
    for (const Plan& p : plans) absl::StrAppendFormat(&out, " %12s", absl::StrCat(PolicyName(p.policy), " reqs"));
  }
  absl::StrAppend(&out, "\n");
  for (size_t i = 0; i < plans[0].rows.size(); ++i) {
    absl::StrAppendFormat(&out, "%8s", ContextLabel(plans[0].rows[i].context));
    for (const Plan& p : plans) absl::StrAppendFormat(&out, " %16s", MiB(p.rows[i].reserved_bytes));
    if (budget) {
      for (const Plan& p : plans) {
        const auto& mc = p.rows[i].max_concurrency;
        absl::StrAppendFormat(&out, " %12s", mc.has_value() ? absl::StrCat(*mc) : "-");
      }
    }
    absl::StrAppend(&out, "\n");
  }
  for (const Plan& p : plans) AppendVllmRuntime(p, out);
  for (const Plan& p : plans) AppendRefusals(p, out);
  return out;
}

}  // namespace kvpage
