// Fuzzes the memory layer behind a KvCacheManager: the host backing with a byte-chosen map
// unit (valid or not), a backing that refuses maps when the bytes say so, views of byte-chosen
// (group, layer, part) values, and requests with byte-chosen multimodal items (offsets and
// lengths anywhere in int64). Each step's "forward pass" writes one byte at every slot the
// step's allocations mapped, requests freed since included, before CompleteStep: a chunk
// unmapped under a pending step faults. Properties:
//   * every error is a Status with a message; Create refuses a bad unit, never crashes;
//   * a refused map makes AllocateSlots return false and backing_status() not OK;
//   * CheckInvariants holds after every operation;
//   * at the end, with every request freed and idle chunks released, nothing is mapped but
//     the null blocks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kv_cache_manager.h"

namespace kvpage::fuzz {
namespace {

constexpr int32_t kVocab = 512;    // the fuzz models' vocab_size
constexpr int32_t kMaxOps = 2048;  // operations per input
constexpr int32_t kMaxLive = 8;

// The host backing, refusing a map when the input's next byte is a multiple of `every`.
class FlakyHostBacking final : public MemoryBacking {
 public:
  FlakyHostBacking(int64_t unit, ByteReader* in, int32_t every)
      : host_(unit), in_(in), every_(every) {}
  absl::Status Reserve(const MemoryLayout& layout) override { return host_.Reserve(layout); }
  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    if (every_ > 0 && in_->Byte() % every_ == 0) {
      ++refusals_;
      return absl::ResourceExhaustedError("refused by the fuzzer");
    }
    return host_.MapChunk(pool, chunk);
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    return host_.UnmapChunk(pool, chunk);
  }
  int64_t map_unit_bytes() const override { return host_.map_unit_bytes(); }
  const HostMemoryBacking& host() const { return host_; }
  int64_t refusals() const { return refusals_; }

 private:
  int64_t refusals_ = 0;
  HostMemoryBacking host_;
  ByteReader* in_;
  int32_t every_;
};

struct Live {
  RequestHandle handle;
  int64_t tokens = 0;
  int64_t computed = 0;
};

// An int64 from 8 bytes, or one of the values that broke readers before.
int64_t Int64(ByteReader& in) {
  static constexpr int64_t kSpecial[] = {0, -1, 1, 3, int64_t{1} << 62, INT64_MAX, INT64_MIN,
                                         -4096, 4096, int64_t{1} << 21, int64_t{1} << 30};
  const uint8_t how = in.Byte();
  if (how < 128) return kSpecial[how % (sizeof(kSpecial) / sizeof(kSpecial[0]))];
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | in.Byte();
  return static_cast<int64_t>(v);
}

class MemoryRun {
 public:
  MemoryRun(const uint8_t* data, size_t size) : in_(data, size) {}

  void Run() {
    if (!Build()) return;
    for (int32_t op = 0; op < kMaxOps && !in_.empty(); ++op) {
      Step();
      KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
    }
    Drain();
    if (std::getenv("KVPAGE_FUZZ_STATS") != nullptr) {
      std::fprintf(stderr, "memory: %d allocations (%d refused), %lld maps refused, %d writes\n",
                   allocations_, refused_, static_cast<long long>(backing_->refusals()), writes_);
    }
  }

 private:
  bool Build() {
    const ModelSpec model = FuzzModel(in_.Byte());
    const uint8_t unit_choice = in_.Byte();
    const int64_t unit = unit_choice < 192 ? (unit_choice % 2 == 0 ? 0 : 4096) : Int64(in_);
    backing_ = std::make_unique<FlakyHostBacking>(unit, &in_, in_.Range(0, 8));
    KvCacheConfig c;
    c.hash_seed = 1;
    c.block_size = in_.Flag() ? 16 : 8;
    c.kv_budget_bytes = int64_t{4096} * in_.Range(8, 200);
    c.chunk_bytes = int64_t{4096} * in_.Range(1, 16);
    c.backing = backing_.get();
    auto m = KvCacheManager::Create(model, c);
    if (!m.ok()) {  // a bad unit or a budget too small: a refusal, not a bug
      CheckError(m.status());
      return false;
    }
    m_ = *std::move(m);
    return true;
  }

  void Step() {
    switch (in_.Byte() % 8) {
      case 0: return Add();
      case 1:
      case 2: return Allocate();
      case 3: return ForwardPassAndComplete();
      case 4: return FreeOne();
      case 5: m_->ReleaseIdleChunks(); return;
      case 6: return View();
      default: return Cached();
    }
  }

  BlockHashExtras Extras() {
    BlockHashExtras extras;
    const int32_t items = in_.Range(0, 2);
    for (int32_t i = 0; i < items; ++i) {
      MultimodalItem item;
      item.identifier = in_.Flag() ? std::string(1, static_cast<char>('a' + in_.Range(0, 3))) : "";
      item.offset = in_.Flag() ? in_.Range(0, 255) : Int64(in_);
      item.length = in_.Flag() ? in_.Range(1, 64) : Int64(in_);
      extras.mm_items.push_back(item);
    }
    return extras;
  }

  std::vector<int32_t> Prompt() {
    std::vector<int32_t> p(static_cast<size_t>(in_.Range(1, 200)));
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>((i * 31 + in_.Range(0, 1)) % kVocab);
    return p;
  }

  void Add() {
    if (live_.size() >= kMaxLive) return;
    KvRequestSpec spec{RequestId(next_id_++), Prompt(), Extras()};
    const int64_t tokens = static_cast<int64_t>(spec.prompt_tokens.size());
    auto h = m_->AddRequest(std::move(spec));
    if (!h.ok()) return CheckError(h.status());
    live_.push_back({*h, tokens, 0});
  }

  void Allocate() {
    if (live_.empty()) return;
    Live& l = live_[in_.Byte() % live_.size()];
    if (l.computed >= l.tokens) {
      KVPAGE_FUZZ_CHECK_OK(m_->AppendTokens(l.handle, {in_.Range(0, kVocab - 1)}));
      ++l.tokens;
    }
    const int64_t n = std::min<int64_t>(in_.Range(1, 64), l.tokens - l.computed);
    const int64_t refusals = backing_->refusals();
    auto ok = m_->AllocateSlots(l.handle, {.num_computed_tokens = l.computed, .num_new_tokens = n});
    if (!ok.ok()) return CheckError(ok.status());
    if (backing_->refusals() > refusals) CheckError(m_->backing_status());
    ++allocations_;
    if (!*ok) {  // memory short, or the backing refused (backing_status says so)
      ++refused_;
      return;
    }
    // Where the forward pass writes: every attention group's slots of the step's tokens.
    for (int32_t g = 0; g < m_->num_groups(); ++g) {
      if (m_->group_kind(GroupId(g)) == LayerKind::kLinearAttention) continue;
      std::vector<int64_t> slots(static_cast<size_t>(n));
      KVPAGE_FUZZ_CHECK_OK(m_->FillSlotMapping(l.handle, GroupId(g), l.computed,
                                               absl::MakeSpan(slots)));
      for (int64_t s : slots) step_slots_.push_back({g, s});
    }
    l.computed += n;
  }

  // Writes one byte at every slot of the step, as the kernels would, then completes it.
  void ForwardPassAndComplete() {
    for (const auto& [g, slot] : step_slots_) {
      const CacheTensor* tensor = nullptr;
      for (const CacheTensor& t : backing_->host().layout().tensors) {
        if (t.group.value == g && t.kind == CacheTensorKind::kKv) tensor = &t;
      }
      if (tensor == nullptr) continue;
      auto view = backing_->host().View(GroupId(g), tensor->layer, TensorPart::kKey);
      KVPAGE_FUZZ_CHECK_OK(view.status());
      const int64_t bs = m_->group_block_size(GroupId(g));
      char* p = static_cast<char*>(view->base) + (slot / bs) * view->byte_strides[0] +
                (slot % bs) * view->byte_strides[1];
      std::memset(p, 0x5a, 1);
      ++writes_;
    }
    step_slots_.clear();
    m_->CompleteStep();
  }

  void FreeOne() {
    if (live_.empty()) return;
    const size_t i = in_.Byte() % live_.size();
    KVPAGE_FUZZ_CHECK_OK(m_->Free(live_[i].handle));
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void View() {
    const GroupId group(in_.Range(-1, 4));
    const int32_t layer = in_.Range(-1, 5);
    const auto part = static_cast<TensorPart>(in_.Range(0, 7));
    auto view = backing_->host().View(group, layer, part);
    if (!view.ok()) CheckError(view.status());
  }

  void Cached() {
    const std::vector<int32_t> prompt = Prompt();
    const int64_t hit = m_->CachedPrefixTokens(prompt, Extras());
    KVPAGE_FUZZ_CHECK(hit >= 0 && hit < static_cast<int64_t>(prompt.size()) + 1);
  }

  void Drain() {
    ForwardPassAndComplete();
    for (const Live& l : live_) KVPAGE_FUZZ_CHECK_OK(m_->Free(l.handle));
    live_.clear();
    m_->CompleteStep();
    m_->ReleaseIdleChunks();
    KVPAGE_FUZZ_CHECK_OK(m_->CheckInvariants());
    KVPAGE_FUZZ_CHECK(m_->Usage().mapped_bytes == 0);
    KVPAGE_FUZZ_CHECK(backing_->host().mapped_bytes() <= m_->Usage().budget_bytes);
  }

  ByteReader in_;
  std::unique_ptr<FlakyHostBacking> backing_;  // outlives m_
  std::unique_ptr<KvCacheManager> m_;
  std::vector<Live> live_;
  std::vector<std::pair<int32_t, int64_t>> step_slots_;  // (group, slot) the step writes
  int64_t next_id_ = 0;
  int32_t allocations_ = 0, refused_ = 0, writes_ = 0;
};

}  // namespace
}  // namespace kvpage::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvpage::fuzz::MemoryRun(data, size).Run();
  return 0;
}
