// The Python Scheduler and its step outputs, whose arrays are NumPy views of the scheduler's
// own buffers (kvpage::SchedulerOutput), never copies.
//
// Lifetime. A SchedulerOutput lives in the scheduler until the next Schedule(), which may
// rewrite or reallocate it. So:
//   * a StepOutput answers only while it is the latest (schedule() not called since): after
//     that every attribute raises RuntimeError;
//   * every array it hands out holds a token counted by its PyScheduler, and schedule(),
//     abort() and finish() raise RuntimeError while any array of the current output is still
//     referenced: no view can be read after the memory under it changed. Keep data across
//     steps with a copy (numpy.array(view)); drop views with `del` (or let them go out of
//     scope) before the next schedule().
// Each array also keeps the scheduler alive. to_dlpack() and to_torch() hand out the same
// arrays as DLPack exports (writable, since torch has no read-only tensors: do not write
// them), under the same rule.
//
// close() frees the scheduler and its memory now, and raises while any array of the current
// output or any cache view (cache_views.cc) is referenced; afterwards every call raises.
#ifndef KVPAGE_PYTHON_STEP_VIEWS_H_
#define KVPAGE_PYTHON_STEP_VIEWS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "kvpage/scheduler.h"
#include "readable_backing.h"

namespace kvpage::python {

// How a view is handed to Python: a read-only NumPy array, or a writable DLPack export
// (an object with __dlpack__ and __dlpack_device__) for torch.from_dlpack and the like.
enum class ViewKind { kNumpy, kDlpack };

class PyScheduler {
 public:
  // `backing` (may be null) is the memory behind `scheduler`'s pools; it outlives it.
  PyScheduler(std::unique_ptr<ReadableHostBacking> backing, std::unique_ptr<Scheduler> scheduler)
      : backing_(std::move(backing)), scheduler_(std::move(scheduler)) {}

  // RuntimeError once close() ran.
  Scheduler& scheduler();
  // The host backing, or RuntimeError when the scheduler has none (or is closed).
  const ReadableHostBacking& backing();
  // RuntimeError unless no view of the current output is referenced.
  void CheckNoLiveViews(const char* call) const;
  // Frees the scheduler and its backing; RuntimeError while any view is referenced.
  void Close();
  // Schedule() and the generation that names its output.
  const SchedulerOutput& Schedule();
  uint64_t generation() const { return generation_; }
  bool closed() const { return scheduler_ == nullptr; }
  const SchedulerOutput* output() const { return output_; }
  ModelOutput& model_output() { return model_output_; }
  int64_t NextRequestId() { return next_request_id_++; }
  void ReserveRequestId(int64_t id) { next_request_id_ = std::max(next_request_id_, id + 1); }

  // A read-only view of `data` ([shape], strides in elements; empty = C order) owned by a
  // token that keeps `self` (this scheduler's Python object) alive and counts as live.
  template <typename T>
  nanobind::object View(nanobind::handle self, const T* data, std::initializer_list<size_t> shape,
                        std::initializer_list<int64_t> strides = {},
                        ViewKind kind = ViewKind::kNumpy);
  // An owner for a view of the cache: keeps `self` alive and counts as a live cache view.
  nanobind::capsule CacheToken(nanobind::handle self) { return MakeToken(self, &cache_views_); }

 private:
  struct Token {
    int64_t* counter;
    PyObject* self;
  };
  nanobind::capsule MakeToken(nanobind::handle self) { return MakeToken(self, &live_views_); }
  nanobind::capsule MakeToken(nanobind::handle self, int64_t* counter);

  std::unique_ptr<ReadableHostBacking> backing_;  // destroyed after scheduler_
  std::unique_ptr<Scheduler> scheduler_;
  const SchedulerOutput* output_ = nullptr;
  uint64_t generation_ = 0;  // Schedule() calls
  int64_t live_views_ = 0;   // arrays of the current output still referenced
  int64_t cache_views_ = 0;  // views of the backing's tensors still referenced
  ModelOutput model_output_;  // reused by update()
  int64_t next_request_id_ = 0;
};

template <typename T>
nanobind::object PyScheduler::View(nanobind::handle self, const T* data,
                                   std::initializer_list<size_t> shape,
                                   std::initializer_list<int64_t> strides, ViewKind kind) {
  static const T kEmpty{};
  if (data == nullptr) data = &kEmpty;  // a zero-size view still needs an address
  if (kind == ViewKind::kDlpack) {
    nanobind::ndarray<nanobind::array_api, T> array(const_cast<T*>(data), shape, MakeToken(self),
                                                    strides);
    return nanobind::cast(std::move(array), nanobind::rv_policy::reference);
  }
  nanobind::ndarray<nanobind::numpy, const T> array(data, shape, MakeToken(self), strides);
  return nanobind::cast(std::move(array), nanobind::rv_policy::reference);
}

// What schedule() returns: the output of one step, valid while it is the latest.
struct StepOutput {
  nanobind::object scheduler_object;  // the PyScheduler, kept alive
  PyScheduler* scheduler = nullptr;
  uint64_t generation = 0;

  // The output, or RuntimeError when schedule() was called since.
  const SchedulerOutput& Get() const;
};

}  // namespace kvpage::python

#endif  // KVPAGE_PYTHON_STEP_VIEWS_H_
