// What `llama-server -c L --parallel N` allocates (llama.cpp build 4da6337 semantics; the
// reference notes peers.md §A2–A4 quote the sizing code this follows). MiniMax-Text-01 and
// MiniMax-M1 follow LLM_ARCH_MINIMAX_01 (ggml-org/llama.cpp PR #27018, merged 2026-08-14).

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "planner/policies.h"

namespace kvpage::internal {
namespace {

constexpr int64_t kCellPad = 256;             // GGML_PAD(n_ctx, 256)
constexpr DType kRecurrentDType = DType::kF32;  // r_l and s_l are always f32

struct Cells {
  int64_t per_stream = 0;  // n_ctx_seq
  int64_t streams = 0;     // n_stream
  int64_t ubatch = 0;      // effective n_ubatch
};

Cells ContextCells(const PlanOptions& o, int64_t context) {
  Cells c;
  const int64_t n_ctx = RoundUp(context, kCellPad);
  if (o.kv_unified) {
    c.per_stream = n_ctx;
    c.streams = 1;
  } else {
    c.per_stream = RoundUp(n_ctx / o.parallel, kCellPad);
    c.streams = o.parallel;
  }
  const int64_t n_batch = std::min<int64_t>(c.per_stream * c.streams, o.batch);
  c.ubatch = std::min<int64_t>(n_batch, o.ubatch);
  return c;
}

// DeepSeek-V3.2's lightning-indexer keys, which llama.cpp serves since release b9411 (PR
// #23346, LLM_ARCH_DEEPSEEK32): llama_kv_cache_dsa (src/llama-kv-cache-dsa.cpp) keeps them in a second
// llama_kv_cache of the same cells, built from the model's hparams with one KV head of
// indexer_head_size values, in the cache's type_k and without a V tensor (an MLA model's
// caches hold K only).
absl::StatusOr<int64_t> IndexerKeyBytes(const AttentionShape& shape, DType type_k) {
  if (!shape.HasIndexer()) return 0;
  return RowBytes(type_k, shape.index_head_dim);
}

// Fills the per-group rows and totals for `-c context --parallel options.parallel`.
absl::StatusOr<PlanRow> Allocate(const ModelSpec& model, const PlanOptions& o, int64_t context) {
  const DType dtype = o.ResolvedKvDtype(model.dtype);
  if (dtype == DType::kFP8) {
    return absl::InvalidArgumentError(
        "kv_cache_dtype fp8 has no llama.cpp cache type; use f16, bf16, f32 or q8_0");
  }
  const Cells cells = ContextCells(o, context);
  PlanRow row;
  row.context = context;
  for (const LayerGroup& group : model.groups) {
    const LayerSpec& spec = group.spec;
    GroupReservation g;
    g.kind = spec.kind;
    g.num_layers = group.num_layers();
    if (spec.kind == LayerKind::kLinearAttention) {
      // One f32 row of n_embd_r() + n_embd_s() values per sequence (llama-memory-recurrent.cpp:
      // n_rows = mem_size · (1 + n_rs_seq), mem_size = max(1, n_seq_max), n_rs_seq 0 without a
      // draft model). MiniMax lightning layers: n_embd_s() = n_embd_head_la² · n_head, one
      // head_dim × head_dim matrix per head (llama-hparams.cpp; minimax-01.cpp:8-9 sets
      // n_embd_head_la = head_dim), and n_embd_r() = 0 (no conv); the reader gives them
      // conv_kernel 1, so ConvValues() is 0 and RecurrentValues() the same matrices.
      const int64_t per_layer =
          (spec.linear.ConvValues() + spec.linear.RecurrentValues()) * BytesPerValue(kRecurrentDType);
      g.blocks = std::max<int64_t>(1, o.parallel);  // one state row per sequence
      g.reserved_bytes = per_layer * g.blocks * g.num_layers;
      row.state_bytes += g.reserved_bytes;
    } else {
      // MLA stores the latent as K only (no V tensor), which AttentionTokenBytes already does.
      KVPAGE_ASSIGN_OR_RETURN(int64_t token_bytes, AttentionTokenBytes(spec.attention, dtype));
      KVPAGE_ASSIGN_OR_RETURN(const int64_t index_bytes, IndexerKeyBytes(spec.attention, dtype));
      token_bytes += index_bytes;
      int64_t per_stream = cells.per_stream;
      // llama.cpp keeps Llama 4's chunked layers in the same iSWA cache as sliding windows,
      // with n_swa = the chunk size (LLAMA_SWA_TYPE_CHUNKED).
      const int64_t window = spec.kind == LayerKind::kChunkedLocal ? spec.attention_chunk_size
                             : spec.kind == LayerKind::kSlidingWindow ? spec.sliding_window
                                                                      : 0;
      if (window > 0 && !o.swa_full) {
        const int64_t window_cells =
            window * (o.kv_unified ? o.parallel : 1) + cells.ubatch;
        per_stream = RoundUp(std::min(cells.per_stream, window_cells), kCellPad);
      }
      g.block_size = 1;
      g.blocks = per_stream * cells.streams;
      g.reserved_bytes = g.blocks * token_bytes * g.num_layers;
    }
    row.reserved_bytes += g.reserved_bytes;
    row.groups.push_back(g);
  }
  return row;
}

// llama.cpp's MiniMax-01 loader marks layer i a lightning (recurrent) layer unless
// (i + 1) % 8 == 0 (src/models/minimax-01.cpp:11-18 at 09b462e0; the converter writes no list
// or interval, so the default 8 holds) and loads wq/wk/wv only for the others. Hybrid memory
// then sizes the two sets with the is_recr filters (src/llama-model.cpp:2292 at master
// 4df29be4): softmax layers get KV cells like any other, lightning layers recurrent rows.
// MiniMax-Text-01 and M1 put softmax attention exactly there; a config whose attn_type_list
// differs would give a GGUF llama.cpp cannot load, so its row allocates nothing and says why.
int32_t FirstMiniMaxLayoutMismatch(const ModelSpec& model) {
  for (int32_t layer = 0; layer < model.num_layers(); ++layer) {
    const bool linear = model.layers[layer].kind == LayerKind::kLinearAttention;
    if (linear != ((layer + 1) % 8 != 0)) return layer;
  }
  return -1;
}

bool RefuseMiniMaxLayout(const ModelSpec& model, std::optional<int64_t> budget, PlanRow& row) {
  if (model.model_type != "minimax" && model.model_type != "minimax_m1") return false;
  const int32_t layer = FirstMiniMaxLayoutMismatch(model);
  if (layer < 0) return false;
  row.refusal = absl::StrCat(
      "llama.cpp's MiniMax-01 architecture puts softmax attention in every 8th layer "
      "(indices 7, 15, ...), but attn_type_list makes layer ", layer,
      (layer + 1) % 8 == 0 ? " lightning" : " softmax", "; such a GGUF would not load");
  row.fixes = {"--policy kvpage, which sizes attn_type_list as it is"};
  if (budget.has_value()) row.max_concurrency = 0;
  return true;
}

}  // namespace

absl::StatusOr<PlanRow> PlanLlamaCppRow(const ModelSpec& model, const PlanOptions& options,
                                        int64_t context, std::optional<int64_t> budget) {
  PlanRow refused{.context = context};
  if (RefuseMiniMaxLayout(model, budget, refused)) return refused;
  KVPAGE_ASSIGN_OR_RETURN(PlanRow row, Allocate(model, options, context));
  if (!budget.has_value()) return row;
  // k requests of `context` tokens at once means `-c k·context --parallel k` (the other flags
  // unchanged); find the largest k that fits. Allocation grows with k, so search.
  PlanOptions k_opts = options;
  auto fits = [&](int64_t k) -> absl::StatusOr<bool> {
    if (k > (int64_t{1} << 40) / context) return false;  // beyond any real context
    k_opts.parallel = static_cast<int32_t>(k);
    KVPAGE_ASSIGN_OR_RETURN(PlanRow r, Allocate(model, k_opts, context * k));
    return r.reserved_bytes <= *budget;
  };
  int64_t lo = 0, hi = 1;  // fits(lo) holds (k = 0 needs nothing); search for a failing hi
  constexpr int64_t kMaxSlots = 65536;
  while (hi <= kMaxSlots) {
    KVPAGE_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, kMaxSlots + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    KVPAGE_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? lo : hi) = mid;
  }
  row.max_concurrency = lo;
  return row;
}

}  // namespace kvpage::internal
