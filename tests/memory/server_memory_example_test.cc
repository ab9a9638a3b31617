// The server-facing sample of docs/manager_api.md §3 ("The memory a server reads"): the code
// between the markers is the doc's sample, compiled and run here, and a test checks the doc
// still shows exactly this code.
#include <gtest/gtest.h>

#include <string>

#include "kvpage/catalog.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kernel_layout.h"
#include "kvpage/scheduler.h"
#include "testing/doc_sample.h"

namespace kvpage {
namespace {

// The kernels' view of one attention layer's K/V in the backing's memory.
absl::StatusOr<KvCacheView> LayerView(const ModelSpec& model, HostMemoryBacking& backing,
                                      GroupId group, int32_t layer) {
  // [server memory]
  SchedulerConfig config;
  config.kv.kv_budget_bytes = int64_t{1} << 30;
  config.kv.backing = &backing;  // on a GPU: a CudaVmmBacking; it must outlive the scheduler
  absl::StatusOr<std::unique_ptr<Scheduler>> created = Scheduler::Create(model, config);
  if (!created.ok()) return created.status();
  // K and V of one layer: strided tensors [num_blocks, block_size, kv_heads, head_dim].
  absl::StatusOr<TensorView> k = backing.View(group, layer, TensorPart::kKey);
  absl::StatusOr<TensorView> v = backing.View(group, layer, TensorPart::kValue);
  if (!k.ok()) return k.status();  // NotFound: the layer is not in that group
  if (!v.ok()) return v.status();
  const int64_t e = BytesPerValue(k->dtype);  // views give strides in bytes
  KvCacheView view{.base = k->base,
                   .block_stride = k->byte_strides[0] / e,
                   .kv_stride = (static_cast<char*>(v->base) - static_cast<char*>(k->base)) / e,
                   .token_stride = k->byte_strides[1] / e,
                   .head_stride = k->byte_strides[2] / e,
                   .num_blocks = static_cast<int32_t>(k->shape[0]),
                   .block_size = static_cast<int32_t>(k->shape[1]),
                   .num_kv_heads = static_cast<int32_t>(k->shape[2]),
                   .head_dim = static_cast<int32_t>(k->shape[3]),
                   .dtype = k->dtype};
  // With out.attention[g].block_table and out.seq_lens this is what ref::PagedDecode,
  // ref::PagedPrefill and kvpage's CUDA paged_decode read.
  // [server memory end]
  return view;
}

TEST(ServerMemoryExample, Gemma3FullAttentionLayer) {
  const ModelSpec model = *LoadModel("gemma-3-4b-it");
  HostMemoryBacking backing;
  absl::StatusOr<KvCacheView> view = LayerView(model, backing, GroupId(1), 5);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(ValidateKvCacheView(*view).ok());
  EXPECT_EQ(view->block_stride, 32768);  // 64 KiB of bf16: K and V of 16 tokens
  EXPECT_EQ(view->kv_stride, 16384);
  EXPECT_EQ(view->token_stride, 1024);
  EXPECT_EQ(view->head_stride, 256);
  EXPECT_EQ(view->num_blocks, 3269);
  HostMemoryBacking other;
  EXPECT_TRUE(absl::IsNotFound(LayerView(model, other, GroupId(0), 5).status()));
}

TEST(ServerMemoryExample, DocShowsThisCode) {
  const absl::Status shown =
      testing::DocShowsSample("docs/manager_api.md",
                              "tests/memory/server_memory_example_test.cc", "server memory");
  EXPECT_TRUE(shown.ok()) << shown;
}

}  // namespace
}  // namespace kvpage
