#include "e2e/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvpage/kernel_layout.h"
#include "kvpage/kernel_reference.h"

namespace kvpage::e2e {
namespace {

// splitmix64: the same weights on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  double Uniform(double scale) {  // in [-scale, scale)
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
  }
  std::vector<double> Matrix(int32_t rows, int32_t cols, double scale) {
    std::vector<double> m(static_cast<size_t>(rows) * cols);
    for (double& w : m) w = Uniform(scale);
    return m;
  }

 private:
  uint64_t s_;
};

// y[r] = Σ_c m[r][c] · x[c].
std::vector<double> MatVec(const std::vector<double>& m, const double* x, int32_t cols) {
  std::vector<double> y(m.size() / cols, 0.0);
  for (size_t r = 0; r < y.size(); ++r) {
    for (int32_t c = 0; c < cols; ++c) y[r] += m[r * cols + c] * x[c];
  }
  return y;
}

std::vector<uint16_t> ToBf16(const std::vector<double>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = ref::FloatToBf16(static_cast<float>(v[i]));
  return bits;
}

void L2Normalize(double* v, int32_t n) {
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) sum += v[i] * v[i];
  const double inv = 1.0 / std::sqrt(sum + 1e-6);
  for (int32_t i = 0; i < n; ++i) v[i] *= inv;
}

double Dot(const std::vector<double>& w, int32_t row, const std::vector<double>& x) {
  double s = 0.0;
  for (size_t c = 0; c < x.size(); ++c) s += w[row * x.size() + c] * x[c];
  return s;
}

}  // namespace

TinyModel::TinyModel(uint64_t seed, int32_t conv_kernel) : conv_kernel_(conv_kernel) {
  Rng rng(seed);
  const double s = 1.0 / std::sqrt(static_cast<double>(kHidden));
  embed_ = rng.Matrix(kVocab, kHidden, 1.0);
  for (int32_t l = 0; l < kNumLayers; ++l) {
    const bool linear = Kind(l) == LayerKind::kLinearAttention;
    wq_.push_back(rng.Matrix(linear ? kConvChannels : kQHeads * kHeadDim, kHidden, 2 * s));
    wk_.push_back(rng.Matrix(kKvHeads * kHeadDim, kHidden, 2 * s));
    wv_.push_back(rng.Matrix(kKvHeads * kHeadDim, kHidden, 2 * s));
    wo_.push_back(rng.Matrix(kHidden, linear ? kKvHeads * kHeadDim : kQHeads * kHeadDim, s));
    wconv_.push_back(rng.Matrix(kConvChannels, conv_kernel_, 0.8));
    wbeta_.push_back(rng.Matrix(kKvHeads, kHidden, s));
    wdecay_.push_back(rng.Matrix(kKvHeads, kHidden, s));
  }
  head_ = rng.Matrix(kVocab, kHidden, 1.0);
}

LayerKind TinyModel::Kind(int32_t layer) {
  switch (layer) {
    case 1: return LayerKind::kLinearAttention;
    case 2: return LayerKind::kFullAttention;
    default: return LayerKind::kSlidingWindow;
  }
}

int32_t TinyModel::WindowLeft(int32_t layer) {
  return Kind(layer) == LayerKind::kSlidingWindow ? kWindow - 1 : -1;
}

ModelSpec TinyModel::Spec() const {
  ModelSpec spec;
  spec.name = "tiny-e2e";
  spec.source = "tests/e2e/tiny_model.h";
  spec.dtype = DType::kBF16;
  spec.max_position_embeddings = kMaxPositions;
  spec.hidden_size = kHidden;
  spec.num_attention_heads = kQHeads;
  spec.vocab_size = kVocab;
  for (int32_t l = 0; l < kNumLayers; ++l) {
    LayerSpec layer;
    layer.kind = Kind(l);
    if (layer.IsAttention()) {
      layer.attention = AttentionShape{.num_kv_heads = kKvHeads, .head_dim_k = kHeadDim,
                                       .head_dim_v = kHeadDim};
      if (layer.kind == LayerKind::kSlidingWindow) layer.sliding_window = kWindow;
    } else {
      layer.linear = LinearStateShape{.conv_kernel = conv_kernel_, .num_k_heads = kKvHeads,
                                      .k_head_dim = kHeadDim, .num_v_heads = kKvHeads,
                                      .v_head_dim = kHeadDim, .conv_dtype = DType::kF32,
                                      .recurrent_dtype = DType::kF32};
    }
    spec.layers.push_back(layer);
  }
  spec.groups = GroupLayers(spec.layers);
  return spec;
}

std::vector<double> TinyModel::Embed(int32_t token, int64_t position) const {
  std::vector<double> x(embed_.begin() + token * kHidden, embed_.begin() + (token + 1) * kHidden);
  for (int32_t i = 0; i < kHidden; ++i) {
    x[i] += 0.5 * std::sin(static_cast<double>(position) / std::pow(10.0, i / 8.0) + i);
  }
  return x;
}

TinyModel::Qkv TinyModel::Project(int32_t layer, const std::vector<double>& x) const {
  return Qkv{ToBf16(MatVec(wq_[layer], x.data(), kHidden)),
             ToBf16(MatVec(wk_[layer], x.data(), kHidden)),
             ToBf16(MatVec(wv_[layer], x.data(), kHidden))};
}

void TinyModel::AddAttentionOutput(int32_t layer, const double* attention,
                                   std::vector<double>& x) const {
  const std::vector<double> o = MatVec(wo_[layer], attention, kQHeads * kHeadDim);
  for (int32_t i = 0; i < kHidden; ++i) x[i] += o[i];
}

int32_t TinyModel::Sample(const std::vector<double>& x) const {
  int32_t best = 0;
  double best_logit = -std::numeric_limits<double>::infinity();
  for (int32_t t = 0; t < kVocab; ++t) {
    const double logit = Dot(head_, t, x);
    if (logit > best_logit) {
      best_logit = logit;
      best = t;
    }
  }
  return best;
}

void TinyModel::LinearStep(int32_t layer, std::vector<double>& x, float* conv,
                           float* state) const {
  constexpr int32_t C = kConvChannels, D = kHeadDim;
  const int32_t K = conv_kernel_;
  const std::vector<double> in = MatVec(wq_[layer], x.data(), kHidden);
  std::vector<double> act(C);
  const std::vector<double>& w = wconv_[layer];
  for (int32_t c = 0; c < C; ++c) {
    double y = w[c * K + K - 1] * in[c];
    for (int32_t t = 0; t < K - 1; ++t) y += w[c * K + t] * conv[t * C + c];  // oldest first
    act[c] = y / (1.0 + std::exp(-y));  // SiLU
  }
  for (int32_t t = 0; t + 1 < K - 1; ++t) {
    for (int32_t c = 0; c < C; ++c) conv[t * C + c] = conv[(t + 1) * C + c];
  }
  for (int32_t c = 0; c < C && K > 1; ++c) conv[(K - 2) * C + c] = static_cast<float>(in[c]);
  std::vector<double> out(kKvHeads * D, 0.0);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    double* q = &act[h * D];
    double* k = &act[kKvHeads * D + h * D];
    const double* v = &act[2 * kKvHeads * D + h * D];
    L2Normalize(q, D);
    L2Normalize(k, D);
    const double beta = 1.0 / (1.0 + std::exp(-Dot(wbeta_[layer], h, x)));
    const double decay = std::exp(-std::log1p(std::exp(Dot(wdecay_[layer], h, x))));
    float* s = state + h * D * D;  // [d_k][d_v]
    std::vector<double> m(D * D);
    for (int32_t i = 0; i < D * D; ++i) m[i] = decay * s[i];
    for (int32_t j = 0; j < D; ++j) {  // delta rule: S += k ⊗ β(v − Sᵀk)
      double recalled = 0.0;
      for (int32_t i = 0; i < D; ++i) recalled += m[i * D + j] * k[i];
      const double delta = beta * (v[j] - recalled);
      for (int32_t i = 0; i < D; ++i) m[i * D + j] += k[i] * delta;
    }
    for (int32_t j = 0; j < D; ++j) {
      for (int32_t i = 0; i < D; ++i) out[h * D + j] += m[i * D + j] * q[i];
    }
    for (int32_t i = 0; i < D * D; ++i) s[i] = static_cast<float>(m[i]);
  }
  const std::vector<double> o = MatVec(wo_[layer], out.data(), kKvHeads * D);
  for (int32_t i = 0; i < kHidden; ++i) x[i] += o[i];
}

void DenseAttention(const uint16_t* q, const std::vector<uint16_t>& k,
                    const std::vector<uint16_t>& v, int64_t position, int32_t window_left,
                    double* out) {
  constexpr int32_t D = TinyModel::kHeadDim, H = TinyModel::kKvHeads;
  constexpr int32_t group = TinyModel::kQHeads / H;
  const TokenRange range = AttendedRange(static_cast<int32_t>(position + 1), window_left);
  std::vector<double> scores;
  for (int32_t h = 0; h < TinyModel::kQHeads; ++h) {
    const int32_t kvh = h / group;
    const uint16_t* qh = q + h * D;
    double* o = out + h * D;
    scores.assign(range.end - range.begin, 0.0);
    double max_score = -std::numeric_limits<double>::infinity();
    const double scale = static_cast<double>(1.0f / std::sqrt(static_cast<float>(D)));
    for (int32_t t = range.begin; t < range.end; ++t) {
      const uint16_t* kr = &k[(static_cast<size_t>(t) * H + kvh) * D];
      double dot = 0.0;
      for (int32_t i = 0; i < D; ++i) {
        dot += static_cast<double>(ref::Bf16ToFloat(qh[i])) *
               static_cast<double>(ref::Bf16ToFloat(kr[i]));
      }
      scores[t - range.begin] = dot * scale;
      max_score = std::max(max_score, scores[t - range.begin]);
    }
    double denom = 0.0;
    for (double& s : scores) {
      s = std::exp(s - max_score);
      denom += s;
    }
    for (int32_t i = 0; i < D; ++i) o[i] = 0.0;
    for (int32_t t = range.begin; t < range.end; ++t) {
      const uint16_t* vr = &v[(static_cast<size_t>(t) * H + kvh) * D];
      const double p = scores[t - range.begin] / denom;
      for (int32_t i = 0; i < D; ++i) o[i] += p * ref::Bf16ToFloat(vr[i]);
    }
  }
}

std::vector<int32_t> DenseGenerate(const TinyModel& model, const std::vector<int32_t>& prompt,
                                   int32_t max_new_tokens) {
  std::vector<int32_t> tokens = prompt;
  std::vector<std::vector<uint16_t>> k(TinyModel::kNumLayers), v(TinyModel::kNumLayers);
  std::vector<float> conv(model.ConvStateValues(), 0.0f);
  std::vector<float> state(TinyModel::kStateValues, 0.0f);
  std::vector<int32_t> generated;
  for (size_t pos = 0; generated.size() < static_cast<size_t>(max_new_tokens); ++pos) {
    std::vector<double> x = model.Embed(tokens[pos], static_cast<int64_t>(pos));
    for (int32_t l = 0; l < TinyModel::kNumLayers; ++l) {
      if (TinyModel::Kind(l) == LayerKind::kLinearAttention) {
        model.LinearStep(l, x, conv.data(), state.data());
        continue;
      }
      const TinyModel::Qkv p = model.Project(l, x);
      k[l].insert(k[l].end(), p.k.begin(), p.k.end());
      v[l].insert(v[l].end(), p.v.begin(), p.v.end());
      double out[TinyModel::kQHeads * TinyModel::kHeadDim];
      DenseAttention(p.q.data(), k[l], v[l], static_cast<int64_t>(pos), TinyModel::WindowLeft(l),
                     out);
      model.AddAttentionOutput(l, out, x);
    }
    if (pos + 1 == tokens.size()) {
      generated.push_back(model.Sample(x));
      tokens.push_back(generated.back());
    }
  }
  return generated;
}

}  // namespace kvpage::e2e
