// PyScheduler's view accounting and the StepOutput class (step_views.h says why).
#include "step_views.h"

#include <cstddef>
#include <string>
#include <utility>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/pair.h>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "kvpage/model_spec.h"

namespace nb = nanobind;

namespace kvpage::python {
namespace {

[[noreturn]] void RaiseRuntime(const std::string& message) {
  PyErr_SetString(PyExc_RuntimeError, message.c_str());
  throw nb::python_error();
}

// Strides of a field of ScheduledRequest (32 bytes) in units of the field's type.
template <typename T>
constexpr int64_t RequestStride() {
  static_assert(sizeof(ScheduledRequest) % sizeof(T) == 0);
  return sizeof(ScheduledRequest) / sizeof(T);
}

// One field of every scheduled request, as a strided view of SchedulerOutput::requests.
template <typename T>
nb::object RequestField(const StepOutput& s, size_t offset, ViewKind kind = ViewKind::kNumpy) {
  const SchedulerOutput& out = s.Get();
  const auto* base = reinterpret_cast<const char*>(out.requests.data());
  const T* first = out.requests.empty() ? nullptr : reinterpret_cast<const T*>(base + offset);
  return s.scheduler->View<T>(s.scheduler_object, first, {out.requests.size()},
                              {RequestStride<T>()}, kind);
}

template <typename T>
nb::object VectorView(const StepOutput& s, const std::vector<T>& v, ViewKind kind) {
  return s.scheduler->View<T>(s.scheduler_object, v.data(), {v.size()}, {}, kind);
}

nb::tuple BlockTables(const StepOutput& s, ViewKind kind) {
  const SchedulerOutput& out = s.Get();
  nb::list tables;
  for (const AttentionBatch& a : out.attention) {
    tables.append(s.scheduler->View<int32_t>(
        s.scheduler_object, a.block_table.data(),
        {static_cast<size_t>(out.num_rows), static_cast<size_t>(a.max_blocks_per_row)}, {},
        kind));
  }
  return nb::tuple(tables);
}

nb::tuple SlotMappings(const StepOutput& s, ViewKind kind) {
  nb::list mappings;
  for (const AttentionBatch& a : s.Get().attention) {
    mappings.append(VectorView(s, a.slot_mapping, kind));
  }
  return nb::tuple(mappings);
}

// read_slots or write_slots of every linear-attention group.
nb::tuple StateSlots(const StepOutput& s, bool write, ViewKind kind) {
  nb::list slots;
  for (const StateBatch& b : s.Get().states) {
    slots.append(VectorView(s, write ? b.write_slots : b.read_slots, kind));
  }
  return nb::tuple(slots);
}

// Every array of the step, by its attribute name.
nb::dict Arrays(const StepOutput& s, ViewKind kind) {
  nb::dict d;
  d["request_ids"] = RequestField<int64_t>(s, offsetof(ScheduledRequest, id), kind);
  d["num_computed_tokens"] =
      RequestField<int64_t>(s, offsetof(ScheduledRequest, num_computed_tokens), kind);
  d["rows"] = RequestField<int32_t>(s, offsetof(ScheduledRequest, row), kind);
  d["num_scheduled_tokens"] =
      RequestField<int32_t>(s, offsetof(ScheduledRequest, num_scheduled_tokens), kind);
  d["samples"] = RequestField<bool>(s, offsetof(ScheduledRequest, samples), kind);
  d["query_start_loc"] = VectorView(s, s.Get().query_start_loc, kind);
  d["seq_lens"] = VectorView(s, s.Get().seq_lens, kind);
  d["block_tables"] = BlockTables(s, kind);
  d["slot_mappings"] = SlotMappings(s, kind);
  d["read_slots"] = StateSlots(s, false, kind);
  d["write_slots"] = StateSlots(s, true, kind);
  return d;
}

// Arrays(kDlpack) through torch.from_dlpack (ModuleNotFoundError without torch).
nb::dict ToTorch(const StepOutput& s) {
  nb::object from_dlpack = nb::module_::import_("torch").attr("from_dlpack");
  nb::dict out;
  for (auto [name, value] : Arrays(s, ViewKind::kDlpack)) {
    if (nb::isinstance<nb::tuple>(value)) {
      nb::list tensors;
      for (nb::handle v : value) tensors.append(from_dlpack(v));
      out[name] = nb::tuple(tensors);
    } else {
      out[name] = from_dlpack(value);
    }
  }
  return out;
}

nb::list AttentionGroups(const StepOutput& s) {
  nb::list groups;
  for (const AttentionBatch& a : s.Get().attention) {
    nb::dict d;
    d["group"] = a.group.value;
    d["kind"] = std::string(LayerKindName(a.kind));
    d["kernel_block_size"] = a.kernel_block_size;
    d["window"] = a.window;
    groups.append(d);
  }
  return groups;
}

std::vector<std::pair<int32_t, int32_t>> SlotsToZero(const StepOutput& s) {
  std::vector<std::pair<int32_t, int32_t>> out;
  for (const SlotToZero& z : s.Get().slots_to_zero) out.emplace_back(z.group.value, z.slot);
  return out;
}

std::vector<int64_t> Ids(const std::vector<RequestId>& ids) {
  std::vector<int64_t> out;
  out.reserve(ids.size());
  for (RequestId id : ids) out.push_back(id.value);
  return out;
}

}  // namespace

Scheduler& PyScheduler::scheduler() {
  if (scheduler_ == nullptr) RaiseRuntime("this Scheduler is closed");
  return *scheduler_;
}

const ReadableHostBacking& PyScheduler::backing() {
  scheduler();  // raises once closed
  if (backing_ == nullptr) {
    RaiseRuntime("this Scheduler has no memory backing: create it with backing='host'");
  }
  return *backing_;
}

void PyScheduler::CheckNoLiveViews(const char* call) const {
  if (live_views_ == 0) return;
  RaiseRuntime(absl::StrCat(
      call, ": ", live_views_, " array(s) of step ", output_ == nullptr ? 0 : output_->step,
      " still reference the scheduler's buffers, which this call may change; drop them "
      "(del) or keep copies (numpy.array(view)) first"));
}

void PyScheduler::Close() {
  CheckNoLiveViews("close()");
  if (cache_views_ != 0) {
    RaiseRuntime(absl::StrCat("close(): ", cache_views_,
                              " view(s) of the cache still reference its memory; drop them "
                              "(del) first"));
  }
  output_ = nullptr;
  ++generation_;  // every StepOutput is stale
  scheduler_.reset();
  backing_.reset();
}

const SchedulerOutput& PyScheduler::Schedule() {
  output_ = &scheduler().Schedule();
  ++generation_;
  return *output_;
}

nb::capsule PyScheduler::MakeToken(nb::handle self, int64_t* counter) {
  auto* token = new Token{counter, self.ptr()};
  Py_INCREF(token->self);
  ++*counter;
  return nb::capsule(token, [](void* p) noexcept {
    auto* t = static_cast<Token*>(p);
    --*t->counter;
    Py_DECREF(t->self);
    delete t;
  });
}

const SchedulerOutput& StepOutput::Get() const {
  if (scheduler->closed()) RaiseRuntime("this StepOutput's Scheduler is closed");
  if (scheduler->generation() != generation || scheduler->output() == nullptr) {
    RaiseRuntime(absl::StrCat("this StepOutput is stale: schedule() ran ",
                              scheduler->generation() - generation,
                              " time(s) since; a step's output is valid until the next "
                              "schedule()"));
  }
  return *scheduler->output();
}

namespace {

// The step's linear-attention bookkeeping and its arrays as DLPack exports.
void DefStatesAndExports(nb::class_<StepOutput>& cls) {
  cls
      .def_prop_ro("state_groups",
                   [](const StepOutput& s) {
                     std::vector<int32_t> groups;
                     for (const StateBatch& b : s.Get().states) groups.push_back(b.group.value);
                     return groups;
                   }, "the linear-attention group of each entry of read_slots and write_slots")
      .def_prop_ro("slots_to_zero", &SlotsToZero,
                   "(group, slot) of state slots newly given to a request: zero them (in "
                   "every layer of the group) before the forward pass")
      .def("to_dlpack", [](const StepOutput& s) { return Arrays(s, ViewKind::kDlpack); },
           "Every array of the step by attribute name (per-group ones as tuples), as DLPack "
           "exports of the same memory (numpy.from_dlpack, torch.from_dlpack). Writable for "
           "torch's sake: do not write them. Same lifetime rule as the attributes.")
      .def("to_torch", &ToTorch,
           "to_dlpack() through torch.from_dlpack: CPU tensors over the scheduler's buffers, "
           "no copies. ModuleNotFoundError without torch.");
}

}  // namespace

void BindStepOutput(nb::module_& m) {
  nb::class_<StepOutput> cls(
      m, "StepOutput",
      "One step's batch (kvpage::SchedulerOutput). Its arrays are read-only NumPy views of "
      "the scheduler's buffers, valid until the next schedule(): after it every attribute "
      "raises RuntimeError, and schedule() itself raises while an array taken from here is "
      "still referenced. Copy what you keep (numpy.array(view)).");
  DefStatesAndExports(cls);
  cls.def_prop_ro("step", [](const StepOutput& s) { return s.Get().step; })
      .def_prop_ro("num_rows", [](const StepOutput& s) { return s.Get().num_rows; })
      .def_prop_ro("total_num_scheduled_tokens",
                   [](const StepOutput& s) { return s.Get().total_num_scheduled_tokens; })
      .def_prop_ro("one_sample_each", [](const StepOutput& s) { return s.Get().one_sample_each; })
      .def_prop_ro("num_requests",
                   [](const StepOutput& s) { return s.Get().requests.size(); })
      .def_prop_ro("request_ids",
                   [](const StepOutput& s) {
                     return RequestField<int64_t>(s, offsetof(ScheduledRequest, id));
                   }, "int64 [num_requests]: the batch's requests, in query order")
      .def_prop_ro("num_computed_tokens",
                   [](const StepOutput& s) {
                     return RequestField<int64_t>(s, offsetof(ScheduledRequest,
                                                              num_computed_tokens));
                   }, "int64 [num_requests]: tokens computed before this step")
      .def_prop_ro("rows",
                   [](const StepOutput& s) {
                     return RequestField<int32_t>(s, offsetof(ScheduledRequest, row));
                   }, "int32 [num_requests]: each request's row in the tables")
      .def_prop_ro("num_scheduled_tokens",
                   [](const StepOutput& s) {
                     return RequestField<int32_t>(s, offsetof(ScheduledRequest,
                                                              num_scheduled_tokens));
                   }, "int32 [num_requests]")
      .def_prop_ro("samples",
                   [](const StepOutput& s) {
                     return RequestField<bool>(s, offsetof(ScheduledRequest, samples));
                   }, "bool [num_requests]: the request samples a token this step")
      .def_prop_ro("query_start_loc",
                   [](const StepOutput& s) {
                     const SchedulerOutput& o = s.Get();
                     return s.scheduler->View<int32_t>(s.scheduler_object,
                                                       o.query_start_loc.data(),
                                                       {o.query_start_loc.size()});
                   }, "int32 [num_rows + 1]")
      .def_prop_ro("seq_lens",
                   [](const StepOutput& s) {
                     return VectorView(s, s.Get().seq_lens, ViewKind::kNumpy);
                   }, "int32 [num_rows]: sequence lengths after the step, 0 if not scheduled")
      .def_prop_ro("block_tables",
                   [](const StepOutput& s) { return BlockTables(s, ViewKind::kNumpy); },
                   "per attention group, int32 [num_rows, max_blocks_per_row] kernel-block ids")
      .def_prop_ro("slot_mappings",
                   [](const StepOutput& s) { return SlotMappings(s, ViewKind::kNumpy); },
                   "per attention group, int64 [total_num_scheduled_tokens]")
      .def_prop_ro("attention_groups", &AttentionGroups,
                   "per attention group: group, kind, kernel_block_size, window")
      .def_prop_ro("read_slots", [](const StepOutput& s) { return StateSlots(s, false, ViewKind::kNumpy); },
                   "per linear-attention group, int32 [num_rows] (-1: row not scheduled)")
      .def_prop_ro("write_slots", [](const StepOutput& s) { return StateSlots(s, true, ViewKind::kNumpy); },
                   "per linear-attention group, int32 [num_rows]")
      .def_prop_ro("finished_ids", [](const StepOutput& s) { return Ids(s.Get().finished_ids); })
      .def_prop_ro("preempted_ids",
                   [](const StepOutput& s) { return Ids(s.Get().preempted_ids); })
      .def_prop_ro("row_moves", [](const StepOutput& s) { return s.Get().row_moves; },
                   "(from, to) rows moved since the last step");
}

}  // namespace kvpage::python
