// kvpage::Scheduler from Python: requests in, step outputs (NumPy views, step_views.h) out,
// sampled tokens back.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "cache_views.h"
#include "kvpage/dtype.h"
#include "kvpage/scheduler.h"
#include "status.h"
#include "step_views.h"

namespace nb = nanobind;

namespace kvpage::python {
namespace {

using TokenArray = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A request's handle: its id, which abort() and finish() also take as an int.
struct Request {
  int64_t id = 0;
};

struct SchedulerOptions {
  int64_t kv_budget_bytes = 0;
  int32_t block_size = 16;
  int32_t max_num_batched_tokens = 8192;
  int32_t max_num_seqs = 256;
  int64_t max_model_len = 0;
  bool enable_chunked_prefill = true;
  int32_t long_prefill_token_threshold = 0;
  std::string scheduling_policy = "fcfs";
  bool enable_prefix_caching = true;
  std::optional<std::string> kv_cache_dtype;
  std::optional<uint64_t> hash_seed;
  int32_t kernel_block_size = 0;
  double watermark = 0;
  int64_t chunk_bytes = int64_t{2} << 20;
  std::optional<std::string> backing;
  int64_t backing_unit_bytes = 0;
};

// The memory behind the pools: none (accounting only) or "host".
std::unique_ptr<ReadableHostBacking> MakeBacking(const SchedulerOptions& o) {
  if (!o.backing.has_value()) return nullptr;
  if (*o.backing != "host") {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("backing must be None or 'host', got '", *o.backing, "'")));
  }
  return std::make_unique<ReadableHostBacking>(o.backing_unit_bytes);
}

SchedulerConfig ToConfig(const SchedulerOptions& o) {
  SchedulerConfig c;
  c.kv.kv_budget_bytes = o.kv_budget_bytes;
  c.kv.block_size = o.block_size;
  c.kv.enable_prefix_caching = o.enable_prefix_caching;
  c.kv.hash_seed = o.hash_seed;
  c.kv.chunk_bytes = o.chunk_bytes;
  if (o.kv_cache_dtype.has_value() && *o.kv_cache_dtype != "auto") {
    c.kv.kv_cache_dtype = ValueOrThrow(ParseDType(*o.kv_cache_dtype));
  }
  c.max_num_batched_tokens = o.max_num_batched_tokens;
  c.max_num_seqs = o.max_num_seqs;
  c.max_model_len = o.max_model_len;
  c.enable_chunked_prefill = o.enable_chunked_prefill;
  c.long_prefill_token_threshold = o.long_prefill_token_threshold;
  if (o.scheduling_policy == "priority") {
    c.policy = SchedulingPolicy::kPriority;
  } else if (o.scheduling_policy != "fcfs") {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "scheduling_policy must be fcfs or priority, got '", o.scheduling_policy, "'")));
  }
  c.kernel_block_size = o.kernel_block_size;
  c.watermark = o.watermark;
  return c;
}

FinishReason ParseReason(const std::string& reason) {
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kMaxModelLen,
                         FinishReason::kAborted}) {
    if (FinishReasonName(r) == reason) return r;
  }
  ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
      "reason must be stop, length, max_model_len or aborted, got '", reason, "'")));
  return FinishReason::kStop;
}

Request AddRequest(PyScheduler& s, std::vector<int32_t> prompt, int32_t max_new_tokens,
                   std::vector<int32_t> stop_token_ids, int32_t priority, double arrival_time,
                   std::string cache_salt, int64_t lora_id, std::optional<int64_t> request_id) {
  const int64_t id = request_id.has_value() ? *request_id : s.NextRequestId();
  if (request_id.has_value()) s.ReserveRequestId(id);
  ThrowIfError(s.scheduler().AddRequest({.id = RequestId(id),
                                         .prompt_token_ids = std::move(prompt),
                                         .max_new_tokens = max_new_tokens,
                                         .stop_token_ids = std::move(stop_token_ids),
                                         .priority = priority,
                                         .arrival_time = arrival_time,
                                         .cache_salt = std::move(cache_salt),
                                         .lora_id = lora_id}));
  return Request{id};
}

StepOutput Schedule(nb::handle self) {
  PyScheduler& s = nb::cast<PyScheduler&>(self);
  s.CheckNoLiveViews("schedule()");
  s.Schedule();
  return StepOutput{nb::borrow(self), &s, s.generation()};
}

// Applies the step's sampled tokens: one per sampling request in query order, or CSR with
// offsets (needed only with speculative drafts, which the Python scheduler does not offer).
std::vector<FinishedRequest> Update(PyScheduler& s, const StepOutput& step, TokenArray tokens,
                                    std::optional<TokenArray> offsets) {
  const SchedulerOutput& out = step.Get();
  ModelOutput& result = s.model_output();
  result.sampled_token_ids.assign(tokens.data(), tokens.data() + tokens.shape(0));
  result.sampled_offsets.clear();
  if (offsets.has_value()) {
    result.sampled_offsets.assign(offsets->data(), offsets->data() + offsets->shape(0));
  } else if (!out.one_sample_each) {
    // One token per sampling request: the offsets count them (Update checks the total).
    result.sampled_offsets.push_back(0);
    for (const ScheduledRequest& r : out.requests) {
      result.sampled_offsets.push_back(result.sampled_offsets.back() + (r.samples ? 1 : 0));
    }
  }
  return ValueOrThrow(s.scheduler().Update(out, result)).finished;
}

// The benchmark's reference: `steps` Schedule() + Update() calls in C++, each request
// sampling `token`. Returns the seconds they took.
double NativeSteps(PyScheduler& s, int64_t steps, int32_t token) {
  s.CheckNoLiveViews("_native_steps()");
  ModelOutput result;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    const SchedulerOutput& out = s.Schedule();
    size_t sampling = 0;
    for (const ScheduledRequest& r : out.requests) sampling += r.samples ? 1 : 0;
    result.sampled_token_ids.assign(sampling, token);
    ThrowIfError(s.scheduler().Update(out, result).status());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BindResults(nb::module_& m) {
  nb::class_<Request>(m, "Request", "A request's handle (its id).")
      .def_ro("id", &Request::id)
      .def("__int__", [](const Request& r) { return r.id; })
      .def("__index__", [](const Request& r) { return r.id; })
      .def("__eq__", [](const Request& a, const Request& b) { return a.id == b.id; })
      .def("__hash__", [](const Request& r) { return std::hash<int64_t>()(r.id); })
      .def("__repr__", [](const Request& r) { return absl::StrCat("kvpage.Request(", r.id, ")"); });
  nb::class_<FinishedRequest>(m, "FinishedRequest")
      .def_prop_ro("id", [](const FinishedRequest& f) { return f.id.value; })
      .def_prop_ro("reason",
                   [](const FinishedRequest& f) { return std::string(FinishReasonName(f.reason)); })
      .def_ro("num_output_tokens", &FinishedRequest::num_output_tokens)
      .def_ro("num_cached_tokens", &FinishedRequest::num_cached_tokens)
      .def("__repr__", [](const FinishedRequest& f) {
        return absl::StrCat("kvpage.FinishedRequest(id=", f.id.value, ", reason='",
                            FinishReasonName(f.reason), "', num_output_tokens=",
                            f.num_output_tokens, ")");
      });
}

}  // namespace

void BindScheduler(nb::module_& m) {
  BindResults(m);
  nb::class_<PyScheduler> cls(
      m, "Scheduler",
      "Continuous batching on kvpage's block manager (kvpage::Scheduler): CPU accounting, "
      "or with backing='host' the K/V memory too (cache()). Not thread-safe: one thread "
      "drives it.");
  DefCacheViews(cls);
  cls.def("__init__",
           [](PyScheduler* self, const ModelSpec& model, int64_t kv_budget_bytes,
              int32_t block_size, int32_t max_num_batched_tokens, int32_t max_num_seqs,
              int64_t max_model_len, bool enable_chunked_prefill,
              int32_t long_prefill_token_threshold, std::string scheduling_policy,
              bool enable_prefix_caching, std::optional<std::string> kv_cache_dtype,
              std::optional<uint64_t> hash_seed, int32_t kernel_block_size, double watermark,
              int64_t chunk_bytes, std::optional<std::string> backing,
              int64_t backing_unit_bytes) {
             const SchedulerOptions o{kv_budget_bytes, block_size, max_num_batched_tokens,
                                      max_num_seqs, max_model_len, enable_chunked_prefill,
                                      long_prefill_token_threshold, scheduling_policy,
                                      enable_prefix_caching, kv_cache_dtype, hash_seed,
                                      kernel_block_size, watermark, chunk_bytes, backing,
                                      backing_unit_bytes};
             std::unique_ptr<ReadableHostBacking> memory = MakeBacking(o);
             SchedulerConfig config = ToConfig(o);
             config.kv.backing = memory.get();
             std::unique_ptr<Scheduler> scheduler =
                 ValueOrThrow(Scheduler::Create(model, config));
             new (self) PyScheduler(std::move(memory), std::move(scheduler));
           },
           nb::arg("model"), nb::kw_only(), nb::arg("kv_budget_bytes"),
           nb::arg("block_size") = 16, nb::arg("max_num_batched_tokens") = 8192,
           nb::arg("max_num_seqs") = 256, nb::arg("max_model_len") = 0,
           nb::arg("enable_chunked_prefill") = true, nb::arg("long_prefill_token_threshold") = 0,
           nb::arg("scheduling_policy") = "fcfs", nb::arg("enable_prefix_caching") = true,
           nb::arg("kv_cache_dtype") = nb::none(), nb::arg("hash_seed") = nb::none(),
           nb::arg("kernel_block_size") = 0, nb::arg("watermark") = 0.0,
           nb::arg("chunk_bytes") = int64_t{2} << 20, nb::arg("backing") = nb::none(),
           nb::arg("backing_unit_bytes") = 0)
      .def("add_request", &AddRequest, nb::arg("prompt_token_ids"), nb::kw_only(),
           nb::arg("max_new_tokens") = 16, nb::arg("stop_token_ids") = std::vector<int32_t>{},
           nb::arg("priority") = 0, nb::arg("arrival_time") = 0.0, nb::arg("cache_salt") = "",
           nb::arg("lora_id") = 0, nb::arg("request_id") = nb::none(),
           "Queues a request; its id is request_id, else the next unused number. ValueError "
           "for a bad prompt or limits, RuntimeError (AlreadyExists) for a live id.")
      .def("schedule", &Schedule, nb::keep_alive<0, 1>(),
           "The next step's batch. RuntimeError while arrays of the previous one are alive.")
      .def("update", &Update, nb::arg("output"), nb::arg("sampled_token_ids"),
           nb::arg("sampled_offsets") = nb::none(),
           "Applies the step's sampled tokens (int32, one per sampling request in query "
           "order, or CSR with sampled_offsets); returns the requests that finished.")
      .def("abort",
           [](PyScheduler& s, int64_t id) {
             s.CheckNoLiveViews("abort()");
             ThrowIfError(s.scheduler().Abort(RequestId(id)));
           },
           nb::arg("request"), "Removes a request; KeyError if unknown or finished.")
      .def("finish",
           [](PyScheduler& s, int64_t id, const std::string& reason) {
             s.CheckNoLiveViews("finish()");
             return ValueOrThrow(s.scheduler().Finish(RequestId(id), ParseReason(reason)));
           },
           nb::arg("request"), nb::arg("reason") = "stop",
           "Ends a request for a reason found outside the scheduler; KeyError if unknown.")
      .def_prop_ro("has_unfinished_requests",
                   [](PyScheduler& s) { return s.scheduler().HasUnfinishedRequests(); })
      .def_prop_ro("num_running", [](PyScheduler& s) { return s.scheduler().num_running(); })
      .def_prop_ro("num_waiting", [](PyScheduler& s) { return s.scheduler().num_waiting(); })
      .def_prop_ro("max_model_len", [](PyScheduler& s) { return s.scheduler().max_model_len(); })
      .def("release_idle_chunks",
           [](PyScheduler& s) { return s.scheduler().ReleaseIdleChunks(); },
           "Gives chunks with no used block back to the budget and their memory back (their "
           "cached blocks are dropped; with backing='host' they read as zeros); returns the "
           "bytes given back. Between schedule() and update() it releases nothing.")
      .def("check_invariants",
           [](PyScheduler& s) { ThrowIfError(s.scheduler().CheckInvariants()); })
      .def("_native_steps", &NativeSteps, nb::arg("steps"), nb::arg("token"));
}

}  // namespace kvpage::python
