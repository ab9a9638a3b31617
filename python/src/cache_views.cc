// Scheduler.cache(), .cache_tensors and .close() (cache_views.h).
#include "cache_views.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvpage/dtype.h"
#include "kvpage/memory_layout.h"
#include "status.h"

namespace nb = nanobind;

namespace kvpage::python {
namespace {

constexpr std::pair<const char*, TensorPart> kParts[] = {
    {"key", TensorPart::kKey},
    {"value", TensorPart::kValue},
    {"latent", TensorPart::kLatent},
    {"conv_state", TensorPart::kConvState},
    {"recurrent_state", TensorPart::kRecurrentState},
};

const char* PartName(TensorPart part) {
  for (const auto& [name, p] : kParts) {
    if (p == part) return name;
  }
  return "unknown";
}

TensorPart ParsePart(const std::string& name) {
  for (const auto& [n, p] : kParts) {
    if (name == n) return p;
  }
  RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
      "part must be key, value, latent, conv_state or recurrent_state, got '", name, "'")));
}

// The parts a tensor of `kind` shows.
std::vector<TensorPart> PartsOf(CacheTensorKind kind) {
  switch (kind) {
    case CacheTensorKind::kKv: return {TensorPart::kKey, TensorPart::kValue};
    case CacheTensorKind::kMlaLatent: return {TensorPart::kLatent};
    case CacheTensorKind::kConvState: return {TensorPart::kConvState};
    case CacheTensorKind::kRecurrentState: return {TensorPart::kRecurrentState};
  }
  return {};
}

// The view of `part` of `layer`: ValueError for a layer out of range, KeyError when the
// layer has no such part (naming the parts it has).
TensorView FindView(const HostMemoryBacking& host, int32_t layer, TensorPart part) {
  const MemoryLayout& layout = host.layout();
  std::string parts;
  for (const CacheTensor& t : layout.tensors) {
    if (t.layer != layer) continue;
    for (TensorPart p : PartsOf(t.kind)) {
      if (p == part) return ValueOrThrow(host.View(t.group, layer, part));
      absl::StrAppend(&parts, parts.empty() ? "" : ", ", PartName(p));
    }
  }
  if (parts.empty()) {
    int32_t layers = 0;
    for (const CacheTensor& t : layout.tensors) layers = std::max(layers, t.layer + 1);
    RaiseStatus(absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is not a cache layer of this model (0 to ", layers - 1,
                     ")")));
  }
  RaiseStatus(absl::NotFoundError(absl::StrCat("layer ", layer, " has no ", PartName(part),
                                               " tensor; its parts: ", parts)));
}

// DLPack's dtype of the cache's values; NumPy has no bf16 or fp8, so `numpy` gives their bits
// (uint16, uint8) instead. RuntimeError for q8_0, which has no per-value layout.
nb::dlpack::dtype ValueDType(DType dtype, bool numpy) {
  using nb::dlpack::dtype_code;
  switch (dtype) {
    case DType::kF32: return nb::dtype<float>();
    case DType::kF16: return {static_cast<uint8_t>(dtype_code::Float), 16, 1};
    case DType::kBF16:
      return numpy ? nb::dtype<uint16_t>()
                   : nb::dlpack::dtype{static_cast<uint8_t>(dtype_code::Bfloat), 16, 1};
    case DType::kFP8: return nb::dtype<uint8_t>();
    case DType::kQ8_0: break;
  }
  RaiseStatus(absl::UnimplementedError(absl::StrCat(
      "a ", DTypeName(dtype), " cache has no per-value view to give")));
}

template <typename Framework>
nb::object MakeArray(const TensorView& v, nb::capsule owner, bool numpy) {
  const nb::dlpack::dtype dtype = ValueDType(v.dtype, numpy);  // raises for q8_0 (0 bytes)
  const int64_t value = BytesPerValue(v.dtype);
  size_t shape[4];
  int64_t strides[4];
  const size_t ndim = v.shape.size();
  for (size_t i = 0; i < ndim; ++i) {
    shape[i] = static_cast<size_t>(v.shape[i]);
    strides[i] = v.byte_strides[i] / value;
  }
  nb::ndarray<Framework> array(v.base, ndim, shape, owner, strides, dtype);
  return nb::cast(std::move(array), nb::rv_policy::reference);
}

nb::object Cache(nb::handle self, int32_t layer, const std::string& part,
                 const std::string& framework) {
  PyScheduler& s = nb::cast<PyScheduler&>(self);
  const TensorPart p = ParsePart(part);
  if (framework != "numpy" && framework != "dlpack" && framework != "torch") {
    RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
        "framework must be numpy, dlpack or torch, got '", framework, "'")));
  }
  const TensorView view = FindView(s.backing().host(), layer, p);
  if (framework == "numpy") return MakeArray<nb::numpy>(view, s.CacheToken(self), true);
  nb::object exported = MakeArray<nb::array_api>(view, s.CacheToken(self), false);
  if (framework == "dlpack") return exported;
  return nb::module_::import_("torch").attr("from_dlpack")(exported);
}

nb::list CacheTensors(PyScheduler& s) {
  const HostMemoryBacking& host = s.backing().host();
  nb::list out;
  for (const CacheTensor& t : host.layout().tensors) {
    for (TensorPart p : PartsOf(t.kind)) {
      const TensorView v = ValueOrThrow(host.View(t.group, t.layer, p));
      nb::dict d;
      d["layer"] = t.layer;
      d["group"] = t.group.value;
      d["part"] = PartName(p);
      d["dtype"] = std::string(DTypeName(t.dtype));
      d["shape"] = nb::tuple(nb::cast(v.shape));
      out.append(d);
    }
  }
  return out;
}

}  // namespace

void DefCacheViews(nb::class_<PyScheduler>& cls) {
  cls.def("cache", &Cache, nb::arg("layer"), nb::arg("part") = "key", nb::kw_only(),
          nb::arg("framework") = "numpy",
          "A view of one layer's cache tensor in the host backing (backing='host'), no copy: "
          "part key or value [num_blocks, block_size, num_kv_heads, head_dim] (strided: a "
          "block holds K then V), latent [num_blocks, block_size, 1, row] (MLA), conv_state "
          "[num_slots, conv_kernel - 1, channels] or recurrent_state [num_slots, num_v_heads, "
          "k_head_dim, v_head_dim]. Index it with the step's block tables, slot mappings and "
          "state slots. framework 'numpy': a writable NumPy array (bf16 and fp8 caches as "
          "their bits, uint16 and uint8); 'dlpack': a DLPack export in the cache's own dtype; "
          "'torch': that through torch.from_dlpack. The view keeps the scheduler alive. "
          "ValueError for a bad layer, part or framework, KeyError when the layer has no "
          "such part, RuntimeError without a backing.")
      .def_prop_ro("cache_tensors", &CacheTensors,
                   "one dict per view cache() gives: layer, group, part, dtype, shape")
      .def("close", [](PyScheduler& s) { s.Close(); },
           "Frees the scheduler and its memory now. RuntimeError while a step's array or a "
           "cache view is referenced; every call raises afterwards.");
}

}  // namespace kvpage::python
