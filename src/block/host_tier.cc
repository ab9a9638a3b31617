// The host tier's slots: reservation, LRU eviction, save completion, pins.
#include "block/host_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"

namespace kvpage::internal {

HostTier::HostTier(const HostTierConfig& config, MemoryBacking* backing, KvEventLog* events)
    : config_(config), backing_(backing), events_(events) {
  slots_.resize(1);  // slot 0 is "none"; records grow with the chunks mapped
}

int32_t HostTier::Find(BlockHash hash, int32_t group) const {
  const auto it = index_.find(Key{hash, group});
  if (it == index_.end()) return 0;
  return slots_[it->second].state == State::kReady ? it->second : 0;
}

bool HostTier::OfferSave(int32_t device, BlockHash hash, int32_t group, bool pinned) {
  if (Contains(hash, group)) return false;
  const int32_t slot = TakeFreeSlot();
  if (slot == 0) return false;
  Slot& s = slots_[slot];
  s.hash = hash;
  s.group = group;
  s.state = State::kSaving;
  ++num_saving_;
  index_.emplace(Key{hash, group}, slot);
  queued_.push_back(PendingSave{device, slot, group, pinned});
  return true;
}

std::vector<PendingSave> HostTier::TakeSaves() {
  std::vector<PendingSave> out;
  out.swap(queued_);
  return out;
}

void HostTier::CancelSaves(int32_t first, int32_t last) {
  size_t kept = 0;
  for (const PendingSave& save : queued_) {
    if (save.device >= first && save.device <= last) {
      KVPAGE_DCHECK(!save.pinned);
      FinishSave(save.host, /*ok=*/false);
    } else {
      queued_[kept++] = save;
    }
  }
  queued_.resize(kept);
}

void HostTier::FinishSave(int32_t slot, bool ok) {
  Slot& s = slots_[slot];
  KVPAGE_DCHECK(s.state == State::kSaving);
  --num_saving_;
  if (ok) {
    s.state = State::kReady;
    ++num_ready_;
    LruAppend(slot);
    AddEvent(KvEvent::Type::kStored, s);
    return;
  }
  index_.erase(Key{s.hash, s.group});
  s = Slot{};
  free_slots_.push_back(slot);
}

void HostTier::Pin(int32_t slot) {
  Slot& s = slots_[slot];
  KVPAGE_DCHECK(s.state == State::kReady);
  if (s.pins++ == 0) LruRemove(slot);
}

void HostTier::Unpin(int32_t slot) {
  Slot& s = slots_[slot];
  KVPAGE_DCHECK(s.pins > 0);
  if (--s.pins == 0) LruAppend(slot);  // a load is a use: most recently used
}

int32_t HostTier::TakeFreeSlot() {
  if (free_slots_.empty() && num_mapped_chunks_ < config_.max_chunks) MapChunk();
  if (free_slots_.empty() && lru_head_ > 0) Evict(lru_head_);
  if (free_slots_.empty()) return 0;
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

bool HostTier::MapChunk() {
  const int32_t c = num_mapped_chunks_;
  if (backing_ != nullptr) {
    absl::Status mapped = backing_->MapChunk(config_.pool_index, c);
    if (!mapped.ok()) {
      if (backing_error_.ok()) backing_error_ = std::move(mapped);
      return false;
    }
  }
  ++num_mapped_chunks_;
  const int32_t first = 1 + c * config_.slots_per_chunk;
  slots_.resize(static_cast<size_t>(first + config_.slots_per_chunk));
  // Lowest id handed out first.
  for (int32_t i = config_.slots_per_chunk - 1; i >= 0; --i) free_slots_.push_back(first + i);
  return true;
}

void HostTier::Evict(int32_t slot) {
  Slot& s = slots_[slot];
  KVPAGE_DCHECK(s.state == State::kReady && s.pins == 0);
  LruRemove(slot);
  AddEvent(KvEvent::Type::kRemoved, s);
  index_.erase(Key{s.hash, s.group});
  s = Slot{};
  --num_ready_;
  ++evictions_;
  free_slots_.push_back(slot);
}

void HostTier::LruAppend(int32_t slot) {
  Slot& s = slots_[slot];
  s.prev = lru_tail_;
  s.next = -1;
  if (lru_tail_ > 0) {
    slots_[lru_tail_].next = slot;
  } else {
    lru_head_ = slot;
  }
  lru_tail_ = slot;
}

void HostTier::LruRemove(int32_t slot) {
  Slot& s = slots_[slot];
  if (s.prev > 0) {
    slots_[s.prev].next = s.next;
  } else {
    lru_head_ = s.next;
  }
  if (s.next > 0) {
    slots_[s.next].prev = s.prev;
  } else {
    lru_tail_ = s.prev;
  }
  s.prev = s.next = -1;
}

void HostTier::AddEvent(KvEvent::Type type, const Slot& s) {
  if (events_ == nullptr || !events_->enabled()) return;
  // As vLLM's offloading connector reports its CPU tier: the hash, no parent, no tokens.
  KvEvent event{type, GroupId(s.group), s.hash, BlockHash{}};
  event.medium = KvMedium::kHost;
  events_->Add(std::move(event));
}

absl::Status HostTier::CheckInvariants() const {
  const int32_t records = static_cast<int32_t>(slots_.size()) - 1;
  if (records != num_mapped_chunks_ * config_.slots_per_chunk) {
    return absl::InternalError(absl::StrCat("host tier of pool ", config_.pool_index, " has ",
                                            records, " slot records for ", num_mapped_chunks_,
                                            " mapped chunks"));
  }
  int32_t ready = 0, saving = 0, in_lru = 0, free_count = 0;
  for (int32_t i = 1; i <= records; ++i) {
    const Slot& s = slots_[i];
    if (s.state == State::kFree) {
      ++free_count;
      continue;
    }
    (s.state == State::kReady ? ready : saving)++;
    const auto it = index_.find(Key{s.hash, s.group});
    if (it == index_.end() || it->second != i) {
      return absl::InternalError(absl::StrCat("host slot ", i, " of pool ", config_.pool_index,
                                              " is not indexed under its key"));
    }
    if (s.pins < 0 || (s.pins > 0 && s.state != State::kReady)) {
      return absl::InternalError(absl::StrCat("host slot ", i, " has ", s.pins, " pins"));
    }
  }
  for (int32_t i = lru_head_, prev = -1; i > 0; prev = i, i = slots_[i].next) {
    if (slots_[i].state != State::kReady || slots_[i].pins != 0 || slots_[i].prev != prev ||
        ++in_lru > records) {
      return absl::InternalError(absl::StrCat("host tier LRU of pool ", config_.pool_index,
                                              " is corrupt at slot ", i));
    }
  }
  int32_t pinned = 0;
  for (int32_t i = 1; i <= records; ++i) pinned += slots_[i].pins > 0 ? 1 : 0;
  if (ready != num_ready_ || saving != num_saving_ ||
      free_count != static_cast<int32_t>(free_slots_.size()) ||
      static_cast<size_t>(ready + saving) != index_.size() || in_lru + pinned != ready) {
    return absl::InternalError(absl::StrCat(
        "host tier of pool ", config_.pool_index, " counts ", num_ready_, " ready, ",
        num_saving_, " saving, but holds ", ready, " ready (", in_lru, " in the LRU, ", pinned,
        " pinned), ", saving, " saving, ", free_count, " free of ", free_slots_.size(),
        " listed, ", index_.size(), " keys"));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::internal
