// KvCacheManager::CheckInvariants: the pools, the budget, the requests' slots, tokens and
// hashes, and every block a request holds against the pools' reference counts.
#include "absl/strings/str_cat.h"
#include "block/manager_impl.h"
#include "internal/status_macros.h"

namespace kvpage {

using internal::RequestState;

namespace {

absl::Status CheckTokens(const ManagerImpl& m, const RequestState& st) {
  // The vector holds every token up to the last full block at least; the tail, the rest.
  const int64_t num_tokens = m.NumTokens(st.slot);
  const int64_t in_vector = static_cast<int64_t>(st.tokens.size());
  if (in_vector > num_tokens || in_vector < num_tokens / m.block_size * m.block_size ||
      in_vector < st.prompt_len) {
    return absl::InternalError(absl::StrCat("request ", st.id.value, " has ", num_tokens,
                                            " tokens, ", in_vector, " of them in its vector"));
  }
  const int64_t full_blocks = num_tokens / m.block_size;
  if (static_cast<int64_t>(st.hashes.hashes().size()) != full_blocks) {
    return absl::InternalError(absl::StrCat("request ", st.id.value, " has ",
                                            st.hashes.hashes().size(), " block hashes for ",
                                            full_blocks, " full blocks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvCacheManager::CheckInvariants() const {
  const Impl& m = *impl_;
  int64_t mapped_bytes = 0;
  std::vector<std::vector<int32_t>> refs(m.pools.size());
  for (size_t p = 0; p < m.pools.size(); ++p) {
    KVPAGE_RETURN_IF_ERROR(m.pools[p]->CheckInvariants());
    mapped_bytes += int64_t{m.pools[p]->num_mapped_chunks()} * m.pools[p]->chunk_charge();
    // Blocks ever handed out have records; ids beyond them are unused (not one int per block
    // the budget could hold: 8 GiB for an INT64_MAX budget).
    refs[p].assign(m.pools[p]->num_block_records(), 0);
  }
  if (mapped_bytes != m.budget->used_bytes()) {
    return absl::InternalError(absl::StrCat("pools map ", mapped_bytes,
                                            " bytes but the budget lent ", m.budget->used_bytes()));
  }
  // Slots: one per live request, found by its id; the rest free.
  if (m.states.size() != m.slot_of.size() + m.free_slots.size()) {
    return absl::InternalError(absl::StrCat(m.states.size(), " slots for ", m.slot_of.size(),
                                            " requests and ", m.free_slots.size(), " free"));
  }
  for (const auto& [id, slot] : m.slot_of) {
    const RequestState* st = m.states[slot].get();
    if (st == nullptr || st->id != id || st->slot != slot) {
      return absl::InternalError(absl::StrCat("request ", id.value, " has a broken slot ", slot));
    }
    if (m.append_counts[slot] != 0) {
      return absl::InternalError(absl::StrCat("slot ", slot, " keeps append scratch"));
    }
    KVPAGE_RETURN_IF_ERROR(CheckTokens(m, *st));
    int64_t next = st->allocated ? m.max_model_len + 1 : 0;
    for (const auto& g : m.groups) {
      if (st->allocated) next = std::min(next, g->NextEvent(m.View(*st)));
      KVPAGE_RETURN_IF_ERROR(g->CountRefs(slot, id, refs[g->layout().pool]));
    }
    if (m.summaries[slot].next_event != next) {
      return absl::InternalError(absl::StrCat("request ", id.value, " keeps next event ",
                                              m.summaries[slot].next_event, ", not ", next));
    }
  }
  m.CountTierRefs(refs);
  KVPAGE_RETURN_IF_ERROR(m.CheckTiers());
  for (size_t p = 0; p < m.pools.size(); ++p) {
    for (int32_t b = 1; b < static_cast<int32_t>(refs[p].size()); ++b) {
      if (refs[p][b] != m.pools[p]->ref_count(BlockId(b))) {
        return absl::InternalError(absl::StrCat("pool ", p, " block ", b, " has ref count ",
                                                m.pools[p]->ref_count(BlockId(b)),
                                                " but requests hold ", refs[p][b], " references"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpage
