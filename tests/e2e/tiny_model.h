// A tiny decoder with random weights and the three layer kinds kvpage serves, for end-to-end
// tests on the host backing (tests only).
//
// Layers: 0 sliding-window attention, 1 Gated-DeltaNet-style linear attention, 2 full
// attention, 3 sliding-window attention. Attention: 4 query heads, 2 KV heads of 8 values,
// K and V stored as bf16, no RoPE (a sinusoidal position code is added to the embedding).
// Linear attention: a causal conv of kernel 4 over q, k and v (f32 conv state), then the
// gated delta rule on a 2 × 8 × 8 f32 state per request. Greedy sampling. With conv kernel 1
// the layer keeps no conv state, only the recurrent one, as MiniMax's lightning attention.
//
// Every per-token computation is a fixed sequence of double operations and the attention is
// computed by the same arithmetic as ref::PagedDecode, so a token's result does not depend on
// batching, chunking or where its K/V and state live: the paged run and DenseGenerate must
// give identical tokens.
#ifndef KVPAGE_TESTS_E2E_TINY_MODEL_H_
#define KVPAGE_TESTS_E2E_TINY_MODEL_H_

#include <cstdint>
#include <vector>

#include "kvpage/model_spec.h"

namespace kvpage::e2e {

class TinyModel {
 public:
  static constexpr int32_t kVocab = 64;
  static constexpr int32_t kHidden = 32;
  static constexpr int32_t kQHeads = 4;
  static constexpr int32_t kKvHeads = 2;
  static constexpr int32_t kHeadDim = 8;
  static constexpr int32_t kWindow = 8;       // sliding window in tokens (query included)
  static constexpr int32_t kConvKernel = 4;     // the default
  static constexpr int32_t kConvChannels = 48;  // q, k (2 heads × 8 each) and v (2 × 8)
  static constexpr int32_t kStateValues = kKvHeads * kHeadDim * kHeadDim;         // 128 f32
  static constexpr int32_t kNumLayers = 4;
  static constexpr int64_t kMaxPositions = 128;

  // conv_kernel >= 1: the linear layer's causal conv width (1: no conv state).
  explicit TinyModel(uint64_t seed, int32_t conv_kernel = kConvKernel);

  // The spec kvpage sizes the cache from (groups: sliding {0, 3}, linear {1}, full {2}).
  ModelSpec Spec() const;
  // f32 values of the conv state: (conv_kernel − 1) × kConvChannels (144 by default).
  int32_t ConvStateValues() const { return (conv_kernel_ - 1) * kConvChannels; }
  static LayerKind Kind(int32_t layer);
  // Tokens before the query that a layer's query attends to (ref::DecodeParams::window_left).
  static int32_t WindowLeft(int32_t layer);

  std::vector<double> Embed(int32_t token, int64_t position) const;
  // Projections of an attention layer: q [kQHeads × kHeadDim], k and v [kKvHeads × kHeadDim],
  // as bf16 bits.
  struct Qkv {
    std::vector<uint16_t> q, k, v;
  };
  Qkv Project(int32_t layer, const std::vector<double>& x) const;
  // x += W_o · attention output ([kQHeads × kHeadDim]).
  void AddAttentionOutput(int32_t layer, const double* attention, std::vector<double>& x) const;
  // One token through a linear-attention layer: reads and updates the conv state
  // [conv_kernel − 1][kConvChannels] and the recurrent state [kKvHeads][kHeadDim][kHeadDim].
  void LinearStep(int32_t layer, std::vector<double>& x, float* conv, float* state) const;
  // Greedy: the lowest token id of the largest logit.
  int32_t Sample(const std::vector<double>& x) const;

 private:
  int32_t conv_kernel_;
  std::vector<double> embed_;                     // [kVocab][kHidden]
  // Per layer, row-major [out][in]. Attention layers use wq_, wk_, wv_, wo_; linear layers
  // wq_ (the 48 conv inputs), wo_ and the conv, beta and decay weights.
  std::vector<std::vector<double>> wq_, wk_, wv_, wo_;
  std::vector<std::vector<double>> wconv_;  // [kConvChannels][conv_kernel]
  std::vector<std::vector<double>> wbeta_, wdecay_;  // [kKvHeads][kHidden]
  std::vector<double> head_;                      // [kVocab][kHidden]
};

// Dense attention over K/V rows [positions][kKvHeads][kHeadDim] (bf16 bits) for the query at
// `position`, with ref::PagedDecode's arithmetic. out: [kQHeads][kHeadDim].
void DenseAttention(const uint16_t* q, const std::vector<uint16_t>& k,
                    const std::vector<uint16_t>& v, int64_t position, int32_t window_left,
                    double* out);

// One request alone, every token through every layer in order, K/V and state in plain
// vectors: the tokens the paged run must reproduce.
std::vector<int32_t> DenseGenerate(const TinyModel& model, const std::vector<int32_t>& prompt,
                                   int32_t max_new_tokens);

}  // namespace kvpage::e2e

#endif  // KVPAGE_TESTS_E2E_TINY_MODEL_H_
