// Attention groups: a block table per request (internal).
//
// AttentionGroup keeps what full attention, MLA and sliding windows share: one table entry per
// block of tokens, grown as the request computes, offered to the prefix cache block by block.
// FullAttentionGroup needs every block from the start. SlidingWindowGroup (its own file) skips
// the tokens its window has moved past (SkippedTokens), whose blocks Release frees.
#ifndef KVPAGE_BLOCK_ATTENTION_GROUP_H_
#define KVPAGE_BLOCK_ATTENTION_GROUP_H_

#include <cstdint>
#include <vector>

#include "block/group_manager.h"

namespace kvpage::internal {

class AttentionGroup : public GroupManager {
 public:
  AttentionGroup(const GroupLayout& layout, BlockPool* pool, const GroupContext* context);

  void Resize(size_t slots) override;
  absl::Status Validate(const RequestView& r, const StepArgs& step) const override;
  int64_t Count(const RequestView& r, const StepArgs& step) const override;
  int64_t Reserve(const RequestView& r, const StepArgs& step) const override;
  void TakeHit(const RequestView& r, absl::Span<const BlockId> hit) override;
  int64_t FreshBlocks(const RequestView& r, const StepArgs& step) const override;
  void Install(const RequestView& r, absl::Span<const BlockId> fresh,
               const StateOutputs& outputs) override;
  void Grow(const RequestView& r, int64_t n) override;
  bool CacheFull(const RequestView& r, int64_t full) override;
  void Release(const RequestView& r, int64_t processed) override;
  void Commit(const RequestView& r) override;
  void CommitThrough(const RequestView& r, int64_t full) override;
  void DropPending(const RequestView& r) override;
  void Free(const RequestView& r) override;
  int64_t NextEvent(const RequestView& r) const override;
  absl::Span<const BlockId> Table(int32_t slot) const override { return tables_[slot].blocks; }
  int64_t NumCached(int32_t slot) const override { return tables_[slot].num_cached; }
  void Uncache(int32_t slot, int64_t first) override;
  // Refuses when a block the rolled-back tokens completed is shared with another request.
  absl::Status CheckRollback(const RequestView& r, RequestId id, int64_t keep) const override;
  absl::Status CountRefs(int32_t slot, RequestId id, std::vector<int32_t>& refs) const override;

 protected:
  // A request's holdings in the group.
  struct TableState {
    // One entry per block of tokens; kNullBlock where a sliding window released the block.
    std::vector<BlockId> blocks;
    // Blocks [0, num_cached) are full of known tokens and offered to the prefix cache: blocks
    // [0, num_published) are in it, the rest pending until the step writing them commits.
    int64_t num_cached = 0;
    int64_t num_published = 0;
    int64_t num_released = 0;  // blocks [0, n) are null (skipped, Release)
  };
  TableState& table(int32_t slot) { return tables_[slot]; }
  const TableState& table(int32_t slot) const { return tables_[slot]; }
  // Blocks of a table of `tokens` tokens (a shift for the usual power-of-two block size: a
  // step asks this several times, and a 64-bit divide is slow).
  int64_t BlocksFor(int64_t tokens) const {
    const int64_t end = tokens + layout().block_size - 1;
    return block_shift_ >= 0 ? end >> block_shift_ : end / layout().block_size;
  }
  // The table's length once the step has its blocks.
  int64_t LengthAfter(const RequestView& r, const StepArgs& step) const;
  // vLLM's full-sequence admission gate for a recycling group (SingleTypeKVCacheManager.
  // get_num_blocks_to_allocate with the admission cap `cap` on the whole sequence's blocks)
  // minus the same count for the step alone: both leave out the max(skipped, held) blocks
  // the request already covers. Negative when the gate asks for fewer.
  int64_t CappedGateBeyondStep(const RequestView& r, const StepArgs& step, int64_t cap,
                               int64_t skipped_blocks) const;
  bool cached(absl::Span<const BlockHash> hashes, int64_t i,
              HitScope scope = HitScope::kDevice) const {
    return Holds(hashes[i], scope);
  }

 private:
  std::vector<TableState> tables_;  // by request slot
  int block_shift_ = -1;            // log2(block_size) when a power of two
};

class FullAttentionGroup final : public AttentionGroup {
 public:
  using AttentionGroup::AttentionGroup;

  // Every block of the sequence stays.
  int64_t MinBlocksFor(int64_t tokens) const override { return BlocksFor(tokens); }
  int hit_rank() const override { return 0; }
  int64_t HitLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                    HitScope scope) const override;
  std::vector<int64_t> HitKeys(int64_t length) const override;
  int64_t KnownLength(absl::Span<const BlockHash> hashes, int64_t max_blocks,
                      absl::Span<const RequestView> in_flight) const override;
};

}  // namespace kvpage::internal

#endif  // KVPAGE_BLOCK_ATTENTION_GROUP_H_
