// CudaVmmBacking: device virtual ranges per tensor, one physical allocation per granule
// (memory/chunk_units.h decides which granules a chunk owns).
#include "kvpage/cuda_vmm_backing.h"

#include <cuda.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "memory/chunk_units.h"
#include "memory/cuda_driver.h"
#include "memory/tensor_view_of.h"

namespace kvpage {
namespace {

absl::Status CuStatus(const internal::CudaDriver* cu, CUresult result,
                      absl::string_view what) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  cu->GetErrorName(result, &name);
  const std::string message = absl::StrCat(what, ": ", name != nullptr ? name : "CUDA error");
  return result == CUDA_ERROR_OUT_OF_MEMORY ? absl::ResourceExhaustedError(message)
                                            : absl::InternalError(message);
}

// One tensor's device range and the physical allocation behind each granule.
struct DeviceRange {
  CUdeviceptr base = 0;
  int64_t size = 0;
  std::vector<CUmemGenericAllocationHandle> handles;  // per granule
  std::vector<uint8_t> present;                       // per granule: mapped
};

}  // namespace

struct CudaVmmBacking::State {
  const internal::CudaDriver* cu = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;
  int64_t granularity = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  bool reserved = false;
  MemoryLayout layout;
  std::vector<DeviceRange> ranges;                 // one per layout.tensors entry
  std::vector<std::vector<int32_t>> pool_tensors;  // per pool, its tensors
  std::vector<std::vector<bool>> mapped;           // per pool, per chunk
  int64_t mapped_bytes = 0;
  int64_t peak_mapped_bytes = 0;
  int64_t reserved_bytes = 0;

  // Maps granules [first, last) of range r; on failure unmaps what it mapped.
  absl::Status MapGranules(DeviceRange& r, int64_t first, int64_t last);
  void UnmapGranules(DeviceRange& r, int64_t first, int64_t last);
  ~State();
};

absl::Status CudaVmmBacking::State::MapGranules(DeviceRange& r, int64_t first, int64_t last) {
  const size_t g = static_cast<size_t>(granularity);
  for (int64_t i = first; i < last; ++i) {
    const CUdeviceptr at = r.base + static_cast<CUdeviceptr>(i) * g;
    CUmemGenericAllocationHandle handle;
    absl::Status status = CuStatus(cu, cu->MemCreate(&handle, g, &prop, 0), "cuMemCreate");
    if (status.ok()) {
      status = CuStatus(cu, cu->MemMap(at, g, 0, handle, 0), "cuMemMap");
      if (status.ok()) {
        status = CuStatus(cu, cu->MemSetAccess(at, g, &access, 1), "cuMemSetAccess");
        if (!status.ok()) cu->MemUnmap(at, g);
      }
      if (!status.ok()) cu->MemRelease(handle);
    }
    if (!status.ok()) {
      UnmapGranules(r, first, i);
      return status;
    }
    r.handles[i] = handle;
    r.present[i] = 1;
    mapped_bytes += granularity;
  }
  peak_mapped_bytes = std::max(peak_mapped_bytes, mapped_bytes);
  return absl::OkStatus();
}

void CudaVmmBacking::State::UnmapGranules(DeviceRange& r, int64_t first, int64_t last) {
  const size_t g = static_cast<size_t>(granularity);
  for (int64_t i = first; i < last; ++i) {
    if (!r.present[i]) continue;
    cu->MemUnmap(r.base + static_cast<CUdeviceptr>(i) * g, g);
    cu->MemRelease(r.handles[i]);
    r.present[i] = 0;
    mapped_bytes -= granularity;
  }
}

CudaVmmBacking::State::~State() {
  for (DeviceRange& r : ranges) {
    UnmapGranules(r, 0, static_cast<int64_t>(r.present.size()));
    if (r.base != 0) cu->MemAddressFree(r.base, static_cast<size_t>(r.size));
  }
  if (context != nullptr) cu->DevicePrimaryCtxRelease(device);
}

absl::StatusOr<std::unique_ptr<CudaVmmBacking>> CudaVmmBacking::Create(int32_t device) {
  absl::StatusOr<const internal::CudaDriver*> driver = internal::LoadCudaDriver();
  if (!driver.ok()) return driver.status();
  const internal::CudaDriver* cu = *driver;
  auto state = std::make_unique<State>();
  state->cu = cu;
  absl::Status status = CuStatus(cu, cu->Init(0), "cuInit");
  if (status.ok()) status = CuStatus(cu, cu->DeviceGet(&state->device, device), "cuDeviceGet");
  int vmm = 0;
  if (status.ok()) {
    status = CuStatus(cu, cu->DeviceGetAttribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, state->device),
        "cuDeviceGetAttribute");
  }
  if (!status.ok()) return status;
  if (vmm == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, " has no CUDA virtual memory management"));
  }
  status = CuStatus(cu, cu->DevicePrimaryCtxRetain(&state->context, state->device),
                    "cuDevicePrimaryCtxRetain");
  if (status.ok()) status = CuStatus(cu, cu->CtxSetCurrent(state->context), "cuCtxSetCurrent");
  if (!status.ok()) return status;
  state->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  state->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  state->prop.location.id = state->device;
  state->access.location = state->prop.location;
  state->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t granularity = 0;
  status = CuStatus(cu, cu->MemGetAllocationGranularity(&granularity, &state->prop,
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                    "cuMemGetAllocationGranularity");
  if (!status.ok()) return status;
  state->granularity = static_cast<int64_t>(granularity);
  return std::unique_ptr<CudaVmmBacking>(new CudaVmmBacking(std::move(state)));
}

CudaVmmBacking::CudaVmmBacking(std::unique_ptr<State> state) : state_(std::move(state)) {}
CudaVmmBacking::~CudaVmmBacking() = default;

const MemoryLayout& CudaVmmBacking::layout() const { return state_->layout; }
int64_t CudaVmmBacking::granularity() const { return state_->granularity; }
int64_t CudaVmmBacking::mapped_bytes() const { return state_->mapped_bytes; }
int64_t CudaVmmBacking::peak_mapped_bytes() const { return state_->peak_mapped_bytes; }
int64_t CudaVmmBacking::reserved_bytes() const { return state_->reserved_bytes; }

absl::Status CudaVmmBacking::Reserve(const MemoryLayout& layout) {
  State& s = *state_;
  const internal::CudaDriver* cu = s.cu;
  if (s.reserved) return absl::FailedPreconditionError("CudaVmmBacking reserved twice");
  if (layout.tensors.empty()) {
    return absl::UnimplementedError(
        "CudaVmmBacking needs per-layer tensors (kvpage accounting); the layout has none");
  }
  s.layout = layout;
  s.pool_tensors.assign(layout.pools.size(), {});
  s.mapped.resize(layout.pools.size());
  for (size_t p = 0; p < layout.pools.size(); ++p) {
    s.mapped[p].assign(static_cast<size_t>(layout.pools[p].max_chunks), false);
  }
  absl::Status status;
  for (size_t i = 0; i < layout.tensors.size() && status.ok(); ++i) {
    const CacheTensor& t = layout.tensors[i];
    if (t.pool < 0 || static_cast<size_t>(t.pool) >= layout.pools.size() || t.block_bytes <= 0) {
      status = absl::InvalidArgumentError(absl::StrCat("tensor ", i, " of layer ", t.layer,
                                                       " names pool ", t.pool, " with ",
                                                       t.block_bytes, " bytes per block"));
      break;
    }
    DeviceRange r;
    r.size = internal::RangeBytes(layout.pools[t.pool], t.block_bytes, s.granularity);
    status = CuStatus(cu, cu->MemAddressReserve(&r.base, static_cast<size_t>(r.size),
                                          static_cast<size_t>(s.granularity), 0, 0),
                      absl::StrCat("cuMemAddressReserve of ", r.size, " bytes for layer ",
                                   t.layer));
    if (!status.ok()) {
      status = absl::ResourceExhaustedError(status.message());
      break;
    }
    r.handles.resize(static_cast<size_t>(r.size / s.granularity));
    r.present.assign(r.handles.size(), 0);
    s.reserved_bytes += r.size;
    s.ranges.push_back(std::move(r));
    s.pool_tensors[t.pool].push_back(static_cast<int32_t>(i));
    // The null block stays mapped: padded block-table entries point at it.
    const int64_t null_units = internal::RoundUpTo(t.block_bytes, s.granularity) / s.granularity;
    status = s.MapGranules(s.ranges.back(), 0, null_units);
  }
  if (!status.ok()) {  // give everything back: Create fails
    for (DeviceRange& r : s.ranges) {
      s.UnmapGranules(r, 0, static_cast<int64_t>(r.present.size()));
      cu->MemAddressFree(r.base, static_cast<size_t>(r.size));
    }
    s.ranges.clear();
    s.reserved_bytes = 0;
    return status;
  }
  s.reserved = true;
  return absl::OkStatus();
}

absl::Status CudaVmmBacking::MapChunk(int32_t pool, int32_t chunk) {
  State& s = *state_;
  KVPAGE_RETURN_IF_ERROR(internal::CheckChunkCall("MapChunk", s.reserved, s.mapped, pool, chunk,
                                                /*expect_mapped=*/false));
  const PoolLayout& layout = s.layout.pools[pool];
  const std::vector<int32_t>& tensors = s.pool_tensors[pool];
  for (size_t done = 0; done < tensors.size(); ++done) {
    DeviceRange& r = s.ranges[tensors[done]];
    const internal::UnitSpan own =
        internal::OwnUnits(layout, s.mapped[pool], s.layout.tensors[tensors[done]].block_bytes,
                           r.size, chunk, s.granularity);
    absl::Status status = s.MapGranules(r, own.first, own.last);
    if (!status.ok()) {  // MapGranules undid its own tensor; undo the ones before
      for (size_t i = 0; i < done; ++i) {
        DeviceRange& back = s.ranges[tensors[i]];
        const internal::UnitSpan undo = internal::OwnUnits(
            layout, s.mapped[pool], s.layout.tensors[tensors[i]].block_bytes, back.size, chunk,
            s.granularity);
        s.UnmapGranules(back, undo.first, undo.last);
      }
      return absl::Status(status.code(),
                          absl::StrCat("MapChunk: chunk ", chunk, " of pool ", pool, ", layer ",
                                       s.layout.tensors[tensors[done]].layer, ": ",
                                       status.message()));
    }
  }
  s.mapped[pool][chunk] = true;
  return absl::OkStatus();
}

absl::Status CudaVmmBacking::UnmapChunk(int32_t pool, int32_t chunk) {
  State& s = *state_;
  KVPAGE_RETURN_IF_ERROR(internal::CheckChunkCall("UnmapChunk", s.reserved, s.mapped, pool,
                                                chunk, /*expect_mapped=*/true));
  s.mapped[pool][chunk] = false;
  for (int32_t t : s.pool_tensors[pool]) {
    DeviceRange& r = s.ranges[t];
    const internal::UnitSpan own = internal::OwnUnits(
        s.layout.pools[pool], s.mapped[pool], s.layout.tensors[t].block_bytes, r.size, chunk,
        s.granularity);
    s.UnmapGranules(r, own.first, own.last);
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorView> CudaVmmBacking::View(GroupId group, int32_t layer,
                                                TensorPart part) const {
  KVPAGE_RETURN_IF_ERROR(internal::CheckTensorPart(part));
  if (!state_->reserved) return absl::FailedPreconditionError("CudaVmmBacking not reserved");
  const CacheTensor* t =
      internal::FindTensor(state_->layout, group, layer, internal::KindOf(part));
  if (t == nullptr) return internal::NoTensor(group, layer, internal::KindOf(part));
  const size_t index = static_cast<size_t>(t - state_->layout.tensors.data());
  return internal::ViewOf(*t,
                          reinterpret_cast<char*>(state_->ranges[index].base) +
                              internal::ViewOffset(t->block_bytes, state_->granularity),
                          state_->layout.pools[t->pool].num_blocks(), part);
}

}  // namespace kvpage
