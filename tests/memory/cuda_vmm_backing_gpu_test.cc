// CudaVmmBacking on a GPU (label "gpu"; scripts/gpu_check.sh runs it): granules mapped and
// released as chunks come and go, shared granules counted once, memory usable through views.
#include "kvpage/cuda_vmm_backing.h"

#include <gtest/gtest.h>

#include <vector>

#include "memory/cuda_driver.h"

namespace kvpage {
namespace {

// One pool of 4 chunks × 8 blocks; two layers whose block is 1/16 granule. Block 1 starts
// granule 1 (the null block ends granule 0), so chunks 0 and 1 share granule 1 of each tensor.
MemoryLayout TwoLayers(int64_t granularity) {
  MemoryLayout layout;
  const int64_t block = granularity / 16;
  layout.pools.push_back(
      PoolLayout{.block_bytes = 2 * block, .blocks_per_chunk = 8, .max_chunks = 4});
  for (int32_t layer = 0; layer < 2; ++layer) {
    CacheTensor t;
    t.group = GroupId(0);
    t.layer = layer;
    t.block_bytes = block;
    t.block_size = 16;
    t.attention = AttentionShape{.num_kv_heads = 8, .head_dim_k = 256, .head_dim_v = 256};
    layout.tensors.push_back(t);
  }
  return layout;
}

TEST(CudaVmmBackingGpu, GranulesFollowChunks) {
  absl::StatusOr<std::unique_ptr<CudaVmmBacking>> created = CudaVmmBacking::Create(0);
  if (absl::IsUnavailable(created.status())) {
    GTEST_SKIP() << "no CUDA driver: " << created.status().message();
  }
  ASSERT_TRUE(created.ok()) << created.status();
  const internal::CudaDriver* cu = *internal::LoadCudaDriver();
  CudaVmmBacking& backing = **created;
  const int64_t g = backing.granularity();
  ASSERT_GT(g, 0);
  ASSERT_TRUE(backing.Reserve(TwoLayers(g)).ok());
  EXPECT_EQ(backing.reserved_bytes(), 2 * 3 * g);  // null granule + 32 blocks of g/16 each
  EXPECT_EQ(backing.mapped_bytes(), 2 * g);        // the null blocks' granules
  ASSERT_TRUE(backing.MapChunk(0, 0).ok());
  EXPECT_EQ(backing.mapped_bytes(), 4 * g);
  ASSERT_TRUE(backing.MapChunk(0, 1).ok());  // in chunk 0's granules
  EXPECT_EQ(backing.mapped_bytes(), 4 * g);
  // Block 9 (chunk 1) of layer 1 takes writes and reads them back.
  const TensorView k = *backing.View(GroupId(0), 1, TensorPart::kKey);
  const CUdeviceptr block9 = reinterpret_cast<CUdeviceptr>(k.base) + 9 * k.byte_strides[0];
  ASSERT_EQ(cu->MemsetD8(block9, 0x5a, static_cast<size_t>(k.byte_strides[0])), CUDA_SUCCESS);
  std::vector<unsigned char> host(static_cast<size_t>(k.byte_strides[0]));
  ASSERT_EQ(cu->MemcpyDtoH(host.data(), block9, host.size()), CUDA_SUCCESS);
  for (unsigned char b : host) ASSERT_EQ(b, 0x5a);
  ASSERT_TRUE(backing.UnmapChunk(0, 0).ok());  // its granules are held by chunk 1
  EXPECT_EQ(backing.mapped_bytes(), 4 * g);
  ASSERT_TRUE(backing.UnmapChunk(0, 1).ok());
  EXPECT_EQ(backing.mapped_bytes(), 2 * g);
  EXPECT_EQ(backing.peak_mapped_bytes(), 4 * g);
  EXPECT_EQ(backing.map_unit_bytes(), g);
  EXPECT_TRUE(absl::IsFailedPrecondition(backing.UnmapChunk(0, 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(backing.MapChunk(0, 4)));
}

}  // namespace
}  // namespace kvpage
