// The tiny model's server loop on kvpage: Schedule, host-tier transfers, state zeroes and
// copies, the forward pass through the reference kernels on the host backing, sampling,
// Update, transfers reported.
#include "e2e/paged_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/host_memory_backing.h"
#include "kvpage/kernel_layout.h"
#include "kvpage/kernel_reference.h"
#include "model/kv_sizing.h"

namespace kvpage::e2e {
namespace {

constexpr int32_t kQ = TinyModel::kQHeads * TinyModel::kHeadDim;    // query values per token
constexpr int32_t kKv = TinyModel::kKvHeads * TinyModel::kHeadDim;  // K (or V) values per token

// The host backing, accounted in exact bytes. The runs' budgets are a few KiB, less than the
// page per tensor the backing commits at least: the manager charges blocks, not pages, so that
// the pools get what the options give them (the pages behind them are committed all the same).
class ExactBytes final : public MemoryBacking {
 public:
  explicit ExactBytes(HostMemoryBacking* inner) : inner_(inner) {}
  absl::Status Reserve(const MemoryLayout& layout) override { return inner_->Reserve(layout); }
  absl::Status MapChunk(int32_t pool, int32_t chunk) override {
    return inner_->MapChunk(pool, chunk);
  }
  absl::Status UnmapChunk(int32_t pool, int32_t chunk) override {
    return inner_->UnmapChunk(pool, chunk);
  }
  int64_t map_unit_bytes() const override { return 1; }

 private:
  HostMemoryBacking* inner_;
};

// Bytes of the null blocks (one block id of every tensor of every layer), which the manager
// charges its budget up front when it has a backing.
absl::StatusOr<int64_t> NullBlockBytes(const ModelSpec& spec, int32_t block_size) {
  int64_t bytes = 0;
  for (const LayerGroup& g : spec.groups) {
    int64_t per_layer = g.spec.linear.NativeBytes();
    if (g.spec.IsAttention()) {
      KVPAGE_ASSIGN_OR_RETURN(int64_t token, internal::AttentionTokenBytes(g.spec.attention,
                                                                           spec.dtype));
      per_layer = token * block_size;
    }
    bytes += per_layer * g.num_layers();
  }
  return bytes;
}

TensorPart PartOf(CacheTensorKind kind) {
  switch (kind) {
    case CacheTensorKind::kKv: return TensorPart::kKey;  // K's view starts the K+V block
    case CacheTensorKind::kMlaLatent: return TensorPart::kLatent;
    case CacheTensorKind::kConvState: return TensorPart::kConvState;
    case CacheTensorKind::kRecurrentState: return TensorPart::kRecurrentState;
    case CacheTensorKind::kIndexKey: return TensorPart::kIndexKey;
  }
  return TensorPart::kKey;
}

// Block `block` of `tensor` in `backing` (the device's, or the host tier's, which lays out the
// same tensors with the tier's slots as block ids).
absl::StatusOr<char*> BlockAt(const HostMemoryBacking& backing, const CacheTensor& tensor,
                              int32_t block) {
  KVPAGE_ASSIGN_OR_RETURN(TensorView view,
                          backing.View(tensor.group, tensor.layer, PartOf(tensor.kind)));
  if (block <= 0 || block >= view.shape[0]) {
    return absl::OutOfRangeError(absl::StrCat("block ", block, " of layer ", tensor.layer,
                                              " is outside [1, ", view.shape[0], ")"));
  }
  return static_cast<char*>(view.base) + block * view.byte_strides[0];
}

// One transfer between its Schedule and its report.
struct InFlight {
  int64_t due_step = 0;  // reported after the Update of this step
  TierTransfers transfers;
  bool fail = false;
};

struct Live {
  std::vector<int32_t> tokens;  // prompt, then generated
  int32_t prompt_len = 0;
  std::vector<uint64_t> prefix;  // prefix[p]: a hash of tokens [0, p]

  uint64_t PrefixKey(int64_t pos) {
    while (static_cast<int64_t>(prefix.size()) <= pos) {
      const uint64_t prev = prefix.empty() ? 0x51ed270b27ad3e35ULL : prefix.back();
      const uint64_t t = static_cast<uint64_t>(tokens[prefix.size()]) + 1;
      prefix.push_back((prev ^ t) * 0x9e3779b97f4a7c15ULL + (prev >> 29));
    }
    return prefix[pos];
  }
};

class Runner {
 public:
  Runner(const TinyModel& model, const RunOptions& options) : model_(model), options_(options) {}
  absl::Status Start(const std::vector<Request>& requests);
  absl::StatusOr<RunResult> Run();

 private:
  absl::Status RunAsync();
  // The tokens of the requests `update` finished (not aborted) become results.
  void RecordFinished(const UpdateResult& update);
  GroupId GroupOf(int32_t layer) const;
  absl::StatusOr<KvCacheView> KvView(int32_t layer) const;
  absl::StatusOr<std::vector<SlotTensor>> StateTensors(GroupId group) const;
  absl::Status ApplyStateOps(const SchedulerOutput& out);
  absl::Status Forward(const SchedulerOutput& out, ModelOutput* sampled);
  absl::Status AttentionLayer(const SchedulerOutput& out, int32_t layer,
                              std::vector<std::vector<double>>& x);
  absl::Status LinearLayer(const SchedulerOutput& out, int32_t layer,
                           std::vector<std::vector<double>>& x);
  void CheckAgainstDense(const ScheduledRequest& r, int32_t layer, int32_t start,
                         const uint16_t* q, const double* paged);
  void Hook(int64_t step, StepPoint point, const SchedulerOutput* out);
  // Host tier: copies `group`'s tensors of one block between the two backings.
  absl::Status CopyBlock(GroupId group, const HostMemoryBacking& from, int32_t from_block,
                         const HostMemoryBacking& to, int32_t to_block);
  absl::Status FillBlock(GroupId group, int32_t block, uint8_t byte);
  absl::Status StartTransfers(int64_t step, const TierTransfers& transfers);
  // Reports the transfers due at `step` or before, oldest first.
  absl::Status CompleteTransfers(int64_t step);
  void NoteLoadStarts(int64_t step);
  absl::Status Drain(int64_t step);

  const TinyModel& model_;
  const RunOptions options_;
  ModelSpec spec_ = model_.Spec();
  HostMemoryBacking backing_;
  ExactBytes exact_{&backing_};
  HostMemoryBacking host_backing_;  // the host tier's slots
  std::deque<InFlight> in_flight_;
  int32_t failures_left_ = options_.failed_load_transfers;
  absl::flat_hash_set<int64_t> loading_;  // requests loading after the latest Schedule
  std::unique_ptr<Scheduler> scheduler_;
  absl::flat_hash_map<int64_t, Live> live_;
  absl::flat_hash_set<int64_t> aborted_;  // aborted during the current step
  // Dense K then V row ([2][kKv] bf16 bits) of each (layer, token prefix) any request
  // computed: what paged attention must read back, whoever wrote it.
  absl::flat_hash_map<std::pair<int32_t, uint64_t>, std::vector<uint16_t>> dense_kv_;
  RunResult result_;
};

GroupId Runner::GroupOf(int32_t layer) const {
  for (size_t g = 0; g < spec_.groups.size(); ++g) {
    for (int32_t l : spec_.groups[g].layers) {
      if (l == layer) return GroupId(static_cast<int32_t>(g));
    }
  }
  return GroupId(-1);
}

absl::Status Runner::Start(const std::vector<Request>& requests) {
  SchedulerConfig config;
  KVPAGE_ASSIGN_OR_RETURN(int64_t null_bytes, NullBlockBytes(spec_, options_.block_size));
  config.kv.kv_budget_bytes = options_.kv_budget_bytes + null_bytes;
  config.kv.chunk_bytes = options_.chunk_bytes;
  config.kv.block_size = options_.block_size;
  config.kv.enable_prefix_caching = options_.enable_prefix_caching;
  config.kv.decode_snapshot_interval_blocks = options_.decode_snapshot_interval_blocks;
  config.kv.hash_seed = 7;
  config.kv.backing = &exact_;
  config.kv.host_cache = {.budget_bytes = options_.host_budget_bytes,
                          .policy = options_.host_policy,
                          .backing = &host_backing_};
  config.max_num_batched_tokens = options_.max_num_batched_tokens;
  config.max_num_seqs = options_.max_num_seqs;
  config.max_model_len = options_.max_model_len;
  config.cuda_graph_row_sizes = options_.cuda_graph_row_sizes;
  config.cuda_graph_token_sizes = options_.cuda_graph_token_sizes;
  config.async_scheduling = options_.async_scheduling;
  KVPAGE_ASSIGN_OR_RETURN(scheduler_, Scheduler::Create(spec_, config));
  for (const Request& r : requests) {
    KVPAGE_RETURN_IF_ERROR(scheduler_->AddRequest(
        {.id = r.id, .prompt_token_ids = r.prompt, .max_new_tokens = r.max_new_tokens}));
    Live& live = live_[r.id.value];
    live.tokens = r.prompt;
    live.prompt_len = static_cast<int32_t>(r.prompt.size());
  }
  return absl::OkStatus();
}

void Runner::Hook(int64_t step, StepPoint point, const SchedulerOutput* out) {
  if (!options_.hook) return;
  for (RequestId id : options_.hook(step, point, out)) {
    if (!scheduler_->Abort(id).ok()) continue;  // finished already
    // A step already scheduled still runs whole, the aborted request's part included: the
    // blocks it fills this step may already serve the prefix cache. Its samples are dropped.
    aborted_.insert(id.value);
  }
}

absl::StatusOr<KvCacheView> Runner::KvView(int32_t layer) const {
  KVPAGE_ASSIGN_OR_RETURN(TensorView k, backing_.View(GroupOf(layer), layer, TensorPart::kKey));
  KVPAGE_ASSIGN_OR_RETURN(TensorView v, backing_.View(GroupOf(layer), layer, TensorPart::kValue));
  const int64_t e = BytesPerValue(k.dtype);
  KvCacheView view{.base = k.base,
                   .block_stride = k.byte_strides[0] / e,
                   .kv_stride = (static_cast<char*>(v.base) - static_cast<char*>(k.base)) / e,
                   .token_stride = k.byte_strides[1] / e,
                   .head_stride = k.byte_strides[2] / e,
                   .num_blocks = static_cast<int32_t>(k.shape[0]),
                   .block_size = static_cast<int32_t>(k.shape[1]),
                   .num_kv_heads = static_cast<int32_t>(k.shape[2]),
                   .head_dim = static_cast<int32_t>(k.shape[3]),
                   .dtype = k.dtype};
  KVPAGE_RETURN_IF_ERROR(ValidateKvCacheView(view));
  return view;
}

absl::StatusOr<std::vector<SlotTensor>> Runner::StateTensors(GroupId group) const {
  std::vector<SlotTensor> tensors;
  for (int32_t layer : spec_.groups[group.value].layers) {
    for (TensorPart part : {TensorPart::kConvState, TensorPart::kRecurrentState}) {
      if (part == TensorPart::kConvState && model_.ConvStateValues() == 0) continue;  // none
      KVPAGE_ASSIGN_OR_RETURN(TensorView t, backing_.View(group, layer, part));
      tensors.push_back(SlotTensor{.base = t.base,
                                   .slot_stride_bytes = t.byte_strides[0],
                                   .copy_bytes = t.byte_strides[0],
                                   .num_slots = static_cast<int32_t>(t.shape[0])});
    }
  }
  return tensors;
}

// Zeroes the state slots the step newly hands out, as the scheduler's contract asks.
absl::Status Runner::ApplyStateOps(const SchedulerOutput& out) {
  for (const SlotToZero& z : out.slots_to_zero) {
    KVPAGE_ASSIGN_OR_RETURN(std::vector<SlotTensor> tensors, StateTensors(z.group));
    KVPAGE_RETURN_IF_ERROR(ref::ZeroSlots(tensors, &z.slot, 1));
  }
  return absl::OkStatus();
}

void Runner::RecordFinished(const UpdateResult& update) {
  for (const FinishedRequest& f : update.finished) {
    if (f.reason == FinishReason::kAborted) continue;
    auto it = live_.find(f.id.value);
    if (it == live_.end()) continue;
    // (Async: a step after the last may have sampled one more; it does not count.)
    const auto first = it->second.tokens.begin() + it->second.prompt_len;
    result_.tokens[f.id.value].assign(first, first + f.num_output_tokens);
    live_.erase(it);
  }
}

absl::Status Runner::RunAsync() {
  struct Step {
    const SchedulerOutput* out = nullptr;
    ModelOutput sampled;
    int64_t step = 0;
  };
  std::optional<Step> in_flight;
  for (int64_t step = 0; scheduler_->HasUnfinishedRequests() || in_flight.has_value();) {
    std::optional<Step> next;
    if (scheduler_->HasUnfinishedRequests()) {
      next = Step{.out = &scheduler_->Schedule(), .step = step++};
      KVPAGE_RETURN_IF_ERROR(StartTransfers(next->step, next->out->transfers));
      NoteLoadStarts(next->step);
      KVPAGE_RETURN_IF_ERROR(Forward(*next->out, &next->sampled));
    }
    if (in_flight.has_value()) {
      KVPAGE_ASSIGN_OR_RETURN(UpdateResult update,
                              scheduler_->Update(*in_flight->out, in_flight->sampled));
      KVPAGE_RETURN_IF_ERROR(CompleteTransfers(in_flight->step));
      RecordFinished(update);
      if (absl::Status s = scheduler_->CheckInvariants(); !s.ok()) {
        return absl::InternalError(absl::StrCat("after step ", in_flight->step, ": ", s.message()));
      }
    }
    in_flight = std::move(next);
    result_.steps = step;
    result_.peak_mapped_bytes = backing_.peak_mapped_bytes();
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> Runner::Run() {
  if (options_.async_scheduling) KVPAGE_RETURN_IF_ERROR(RunAsync());
  for (int64_t step = 0; !options_.async_scheduling && scheduler_->HasUnfinishedRequests();
       ++step) {
    Hook(step, StepPoint::kBeforeSchedule, nullptr);
    for (int64_t id : aborted_) live_.erase(id);
    aborted_.clear();
    if (!scheduler_->HasUnfinishedRequests()) break;
    const SchedulerOutput& out = scheduler_->Schedule();
    KVPAGE_RETURN_IF_ERROR(StartTransfers(step, out.transfers));
    NoteLoadStarts(step);
    Hook(step, StepPoint::kAfterSchedule, &out);
    ModelOutput sampled;
    KVPAGE_RETURN_IF_ERROR(Forward(out, &sampled));
    Hook(step, StepPoint::kAfterForward, &out);
    KVPAGE_ASSIGN_OR_RETURN(UpdateResult update, scheduler_->Update(out, sampled));
    Hook(step, StepPoint::kAfterUpdate, &out);
    KVPAGE_RETURN_IF_ERROR(CompleteTransfers(step));
    for (int64_t id : aborted_) live_.erase(id);
    aborted_.clear();
    RecordFinished(update);
    if (absl::Status s = scheduler_->CheckInvariants(); !s.ok()) {
      return absl::InternalError(absl::StrCat("after step ", step, ": ", s.message()));
    }
    result_.steps = step + 1;
    result_.peak_mapped_bytes = backing_.peak_mapped_bytes();
  }
  KVPAGE_RETURN_IF_ERROR(Drain(result_.steps));
  KVPAGE_RETURN_IF_ERROR(scheduler_->CheckInvariants());
  result_.preemptions = scheduler_->stats().preemptions;
  result_.prefix_hit_tokens = scheduler_->stats().prefix_hit_tokens;
  result_.host_hit_tokens = scheduler_->stats().host_hit_tokens;
  result_.host = scheduler_->kv_cache().host_cache_stats();
  result_.final_used_bytes = scheduler_->kv_cache().Usage().used_bytes;
  return result_;
}

absl::Status Runner::CopyBlock(GroupId group, const HostMemoryBacking& from, int32_t from_block,
                               const HostMemoryBacking& to, int32_t to_block) {
  for (const CacheTensor& tensor : backing_.layout().tensors) {
    if (tensor.group != group) continue;
    KVPAGE_ASSIGN_OR_RETURN(const char* src, BlockAt(from, tensor, from_block));
    KVPAGE_ASSIGN_OR_RETURN(char* dst, BlockAt(to, tensor, to_block));
    std::memcpy(dst, src, static_cast<size_t>(tensor.block_bytes));
  }
  return absl::OkStatus();
}

absl::Status Runner::FillBlock(GroupId group, int32_t block, uint8_t byte) {
  for (const CacheTensor& tensor : backing_.layout().tensors) {
    if (tensor.group != group) continue;
    KVPAGE_ASSIGN_OR_RETURN(char* dst, BlockAt(backing_, tensor, block));
    std::memset(dst, byte, static_cast<size_t>(tensor.block_bytes));
  }
  return absl::OkStatus();
}

// Saves run now, before the forward pass: write-back saves read blocks it may overwrite, and
// a load in the same transfer may target a block a save reads, so saves go first.
absl::Status Runner::StartTransfers(int64_t step, const TierTransfers& transfers) {
  if (transfers.empty()) return absl::OkStatus();
  InFlight t{.due_step = step + options_.transfer_delay_steps, .transfers = transfers};
  t.fail = !transfers.loads.empty() && failures_left_ > 0;
  if (t.fail) --failures_left_;
  for (const TierCopy& c : t.fail ? std::vector<TierCopy>{} : transfers.saves) {
    KVPAGE_RETURN_IF_ERROR(CopyBlock(c.group, backing_, c.device.value, host_backing_, c.host));
  }
  for (const TierCopy& c : transfers.loads) {
    KVPAGE_RETURN_IF_ERROR(FillBlock(c.group, c.device.value, 0xff));
  }
  in_flight_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Runner::CompleteTransfers(int64_t step) {
  while (!in_flight_.empty() && in_flight_.front().due_step <= step) {
    const InFlight t = std::move(in_flight_.front());
    in_flight_.pop_front();
    for (const TierCopy& c : t.transfers.loads) {
      if (t.fail) continue;
      KVPAGE_RETURN_IF_ERROR(CopyBlock(c.group, host_backing_, c.host, backing_, c.device.value));
      ++result_.loaded_blocks[spec_.groups[c.group.value].spec.kind];
    }
    KVPAGE_RETURN_IF_ERROR(scheduler_->CompleteTransfers(t.transfers.id, !t.fail));
    ++result_.transfers;
  }
  return absl::OkStatus();
}

void Runner::NoteLoadStarts(int64_t step) {
  std::vector<int64_t> ids;
  for (const auto& [id, live] : live_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  absl::flat_hash_set<int64_t> loading;
  for (int64_t id : ids) {
    const std::optional<RequestHandle> h = scheduler_->kv_cache().Find(RequestId(id));
    if (!h.has_value()) continue;
    const absl::StatusOr<bool> is_loading = scheduler_->kv_cache().IsLoading(*h);
    if (!is_loading.ok() || !*is_loading) continue;
    loading.insert(id);
    if (!loading_.contains(id)) result_.load_starts.emplace_back(step, RequestId(id));
  }
  loading_ = std::move(loading);
}

// The last Update completed its step; the write-through saves of the blocks it filled are
// handed over by the next output. Empty steps until no transfer is queued or in flight.
absl::Status Runner::Drain(int64_t step) {
  for (int64_t i = 0; i < 3; ++i) {
    KVPAGE_RETURN_IF_ERROR(CompleteTransfers(std::numeric_limits<int64_t>::max()));
    const SchedulerOutput& out = scheduler_->Schedule();
    if (!out.requests.empty()) return absl::InternalError("a request was scheduled after the run");
    KVPAGE_RETURN_IF_ERROR(StartTransfers(step + i, out.transfers));
    KVPAGE_RETURN_IF_ERROR(scheduler_->Update(out, ModelOutput{}).status());
    if (out.transfers.empty()) return absl::OkStatus();
  }
  return absl::InternalError("transfers still queued after the run");
}

absl::Status Runner::Forward(const SchedulerOutput& out, ModelOutput* sampled) {
  KVPAGE_RETURN_IF_ERROR(ApplyStateOps(out));
  result_.padded_steps += out.padded ? 1 : 0;
  if (out.requests.empty()) return absl::OkStatus();  // every request waits for its loads
  std::vector<std::vector<double>> x(static_cast<size_t>(out.total_num_scheduled_tokens));
  for (const ScheduledRequest& r : out.requests) {
    if (r.is_new && r.num_computed_tokens > 0) ++result_.resumed_from_snapshot;
    const Live& live = live_.at(r.id.value);
    const int32_t start = out.query_start_loc[r.row];
    for (int32_t i = 0; i < r.num_scheduled_tokens; ++i) {
      const int64_t pos = r.num_computed_tokens + i;
      x[start + i] = model_.Embed(live.tokens[pos], pos);
    }
  }
  for (int32_t layer = 0; layer < TinyModel::kNumLayers; ++layer) {
    KVPAGE_RETURN_IF_ERROR(TinyModel::Kind(layer) == LayerKind::kLinearAttention
                               ? LinearLayer(out, layer, x)
                               : AttentionLayer(out, layer, x));
  }
  sampled->sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples) {
      const int32_t last = out.query_start_loc[r.row] + r.num_scheduled_tokens - 1;
      sampled->sampled_token_ids.push_back(model_.Sample(x[last]));
      live_.at(r.id.value).tokens.push_back(sampled->sampled_token_ids.back());
    }
    sampled->sampled_offsets.push_back(static_cast<int32_t>(sampled->sampled_token_ids.size()));
  }
  return absl::OkStatus();
}

absl::Status Runner::AttentionLayer(const SchedulerOutput& out, int32_t layer,
                                    std::vector<std::vector<double>>& x) {
  const GroupId group = GroupOf(layer);
  const AttentionBatch* batch = nullptr;
  for (const AttentionBatch& b : out.attention) batch = b.group == group ? &b : batch;
  if (batch == nullptr) return absl::InternalError(absl::StrCat("no batch for layer ", layer));
  KVPAGE_ASSIGN_OR_RETURN(KvCacheView cache, KvView(layer));
  // Padded for a CUDA graph or not: the padding rows and tokens must change nothing.
  const int32_t total = out.num_padded_tokens;
  std::vector<uint16_t> q(static_cast<size_t>(total) * kQ), k(total * kKv), v(total * kKv);
  for (const ScheduledRequest& r : out.requests) {
    const int32_t start = out.query_start_loc[r.row];
    for (int32_t i = 0; i < r.num_scheduled_tokens; ++i) {
      const int32_t t = start + i;
      const TinyModel::Qkv p = model_.Project(layer, x[t]);
      std::copy(p.q.begin(), p.q.end(), q.begin() + t * kQ);
      std::copy(p.k.begin(), p.k.end(), k.begin() + t * kKv);
      std::copy(p.v.begin(), p.v.end(), v.begin() + t * kKv);
      std::vector<uint16_t>& dense =
          dense_kv_[{layer, live_.at(r.id.value).PrefixKey(r.num_computed_tokens + i)}];
      dense.assign(p.k.begin(), p.k.end());
      dense.insert(dense.end(), p.v.begin(), p.v.end());
    }
  }
  KVPAGE_RETURN_IF_ERROR(ref::WriteKv(k.data(), v.data(), kKv, kKv, batch->slot_mapping.data(), total,
                                           cache));
  std::vector<double> o(static_cast<size_t>(total) * kQ);
  const BlockTableView table{.table = batch->block_table.data(),
                             .row_stride = batch->max_blocks_per_row,
                             .seq_lens = out.seq_lens.data(),
                             .num_seqs = out.num_padded_rows};
  const DecodeParams params{.num_q_heads = TinyModel::kQHeads,
                            .scale = 1.0f / std::sqrt(static_cast<float>(TinyModel::kHeadDim)),
                            .window_left = TinyModel::WindowLeft(layer)};
  KVPAGE_RETURN_IF_ERROR(ref::PagedPrefill(q.data(), kQ, out.query_start_loc.data(), cache, table,
                                           params, o.data(), nullptr));
  for (const ScheduledRequest& r : out.requests) {
    const int32_t start = out.query_start_loc[r.row];
    CheckAgainstDense(r, layer, start, q.data(), o.data());
    for (int32_t i = 0; i < r.num_scheduled_tokens; ++i) {
      model_.AddAttentionOutput(layer, o.data() + (start + i) * kQ, x[start + i]);
    }
  }
  return absl::OkStatus();
}

void Runner::CheckAgainstDense(const ScheduledRequest& r, int32_t layer, int32_t start,
                               const uint16_t* q, const double* paged) {
  Live& live = live_.at(r.id.value);
  for (int32_t i = 0; i < r.num_scheduled_tokens; ++i) {
    const int64_t pos = r.num_computed_tokens + i;
    std::vector<uint16_t> k, v;  // [0, pos] from whichever request computed them
    bool complete = true;
    for (int64_t p = 0; p <= pos && complete; ++p) {
      auto it = dense_kv_.find({layer, live.PrefixKey(p)});
      complete = it != dense_kv_.end();
      if (!complete) break;
      k.insert(k.end(), it->second.begin(), it->second.begin() + kKv);
      v.insert(v.end(), it->second.begin() + kKv, it->second.end());
    }
    double dense[kQ];
    if (complete) DenseAttention(q + (start + i) * kQ, k, v, pos, TinyModel::WindowLeft(layer), dense);
    ++result_.attention_checks;
    if (!complete || std::memcmp(dense, paged + (start + i) * kQ, sizeof(dense)) != 0) {
      ++result_.attention_mismatches;
    }
  }
}

absl::Status Runner::LinearLayer(const SchedulerOutput& out, int32_t layer,
                                 std::vector<std::vector<double>>& x) {
  const GroupId group = GroupOf(layer);
  const StateBatch* batch = nullptr;
  for (const StateBatch& b : out.states) batch = b.group == group ? &b : batch;
  if (batch == nullptr) return absl::InternalError(absl::StrCat("no states for layer ", layer));
  KVPAGE_ASSIGN_OR_RETURN(TensorView state_view,
                          backing_.View(group, layer, TensorPart::kRecurrentState));
  // A layer without a conv state (conv kernel 1) has no conv tensor.
  TensorView conv_view = state_view;
  if (model_.ConvStateValues() > 0) {
    KVPAGE_ASSIGN_OR_RETURN(conv_view, backing_.View(group, layer, TensorPart::kConvState));
  }
  for (const ScheduledRequest& r : out.requests) {
    const int32_t read = batch->read_slots[r.row], write = batch->write_slots[r.row];
    if (read < 0 || write < 0 || read >= state_view.shape[0] || write >= state_view.shape[0]) {
      return absl::InternalError(absl::StrCat("request ", r.id.value, " has state slots ", read,
                                              " -> ", write));
    }
    auto at = [](const TensorView& t, int32_t slot) {
      return reinterpret_cast<float*>(static_cast<char*>(t.base) + slot * t.byte_strides[0]);
    };
    std::vector<float> conv(at(conv_view, read), at(conv_view, read) + model_.ConvStateValues());
    std::vector<float> state(at(state_view, read), at(state_view, read) + TinyModel::kStateValues);
    const int32_t start = out.query_start_loc[r.row];
    for (int32_t i = 0; i < r.num_scheduled_tokens; ++i) {
      model_.LinearStep(layer, x[start + i], conv.data(), state.data());
    }
    if (!conv.empty()) std::memcpy(at(conv_view, write), conv.data(), conv.size() * sizeof(float));
    std::memcpy(at(state_view, write), state.data(), state.size() * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RunResult> RunPaged(const TinyModel& model, const std::vector<Request>& requests,
                                   const RunOptions& options) {
  Runner runner(model, options);
  KVPAGE_RETURN_IF_ERROR(runner.Start(requests));
  return runner.Run();
}

}  // namespace kvpage::e2e
