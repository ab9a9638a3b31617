// The fleet's routers (formulas in router.h).
#include "sim/router.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/status_macros.h"
#include "kvpage/kv_event_wire.h"
#include "sim/kv_event_index.h"

namespace kvpage::sim {
namespace {

class RoundRobinRouter final : public Router {
 public:
  int32_t Pick(const RouteRequest&, absl::Span<const Replica* const> replicas) override {
    const int32_t r = static_cast<int32_t>(next_ % replicas.size());
    ++next_;
    return r;
  }

 private:
  uint64_t next_ = 0;
};

int32_t LeastLoaded(absl::Span<const Replica* const> replicas) {
  int32_t best = 0;
  for (size_t r = 1; r < replicas.size(); ++r) {
    if (replicas[r]->outstanding_tokens() < replicas[best]->outstanding_tokens()) {
      best = static_cast<int32_t>(r);
    }
  }
  return best;
}

class LeastLoadedRouter final : public Router {
 public:
  int32_t Pick(const RouteRequest&, absl::Span<const Replica* const> replicas) override {
    return LeastLoaded(replicas);
  }
};

// Both cache-aware routers: argmin of w · (P − C_r) / B + L_r / B, then of L_r, then index.
class CostRouter : public Router {
 public:
  CostRouter(double overlap_weight, int32_t block_size)
      : weight_(overlap_weight), block_size_(block_size) {}

  int32_t Pick(const RouteRequest& request, absl::Span<const Replica* const> replicas) final {
    Prepare(request);
    const double prompt = static_cast<double>(request.prompt.size());
    const double b = static_cast<double>(block_size_);
    int32_t best = -1;
    double best_cost = std::numeric_limits<double>::infinity();
    for (size_t r = 0; r < replicas.size(); ++r) {
      const int64_t cached = CachedTokens(static_cast<int32_t>(r), request, *replicas[r]);
      const int64_t load = replicas[r]->outstanding_tokens();
      const double cost =
          weight_ * (prompt - static_cast<double>(cached)) / b + static_cast<double>(load) / b;
      if (best < 0 || cost < best_cost ||
          (cost == best_cost && load < replicas[best]->outstanding_tokens())) {
        best = static_cast<int32_t>(r);
        best_cost = cost;
      }
    }
    return best;
  }

 protected:
  // Called once per request before CachedTokens is asked for each replica.
  virtual void Prepare(const RouteRequest&) {}
  // C_r: the prompt tokens replica r would serve from its cache.
  virtual int64_t CachedTokens(int32_t r, const RouteRequest& request,
                               const Replica& replica) = 0;
  int32_t block_size() const { return block_size_; }

 private:
  double weight_;
  int32_t block_size_;
};

class PrefixAwareRouter final : public CostRouter {
 public:
  using CostRouter::CostRouter;

 private:
  int64_t CachedTokens(int32_t, const RouteRequest& request, const Replica& replica) override {
    return replica.kv_cache().CachedPrefixTokens(request.prompt);
  }
};

class KvEventsRouter final : public CostRouter {
 public:
  KvEventsRouter(int32_t replicas, double overlap_weight, int32_t block_size, int32_t group)
      : CostRouter(overlap_weight, block_size),
        indexes_(static_cast<size_t>(replicas), KvEventIndex(block_size, group)) {}

  bool wants_kv_events() const override { return true; }
  absl::Status Observe(int32_t replica, std::string_view payload) override {
    absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(payload);
    if (!batch.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("replica ", replica, "'s KV events: ",
                                                     batch.status().message()));
    }
    return indexes_[static_cast<size_t>(replica)].Apply(*batch);
  }

 private:
  void Prepare(const RouteRequest& request) override {
    keys_ = indexes_[0].PromptKeys(request.prompt);
  }
  int64_t CachedTokens(int32_t r, const RouteRequest&, const Replica&) override {
    return indexes_[static_cast<size_t>(r)].MatchBlocks(keys_) * block_size();
  }

  std::vector<KvEventIndex> indexes_;
  std::vector<uint64_t> keys_;  // the request's chain keys (Prepare)
};

}  // namespace

absl::Status Router::Observe(int32_t, std::string_view) { return absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<Router>> CreateRouter(RouterKind kind, int32_t replicas,
                                                     double overlap_weight, int32_t block_size,
                                                     int32_t indexed_group) {
  if (replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("replicas must be >= 1, got ", replicas));
  }
  if (block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block size must be >= 1, got ", block_size));
  }
  if (!std::isfinite(overlap_weight) || overlap_weight < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("overlap weight must be finite and >= 0, got ", overlap_weight));
  }
  switch (kind) {
    case RouterKind::kRoundRobin:
      return std::make_unique<RoundRobinRouter>();
    case RouterKind::kLeastLoaded:
      return std::make_unique<LeastLoadedRouter>();
    case RouterKind::kPrefixAware:
      return std::make_unique<PrefixAwareRouter>(overlap_weight, block_size);
    case RouterKind::kKvEvents:
      return std::make_unique<KvEventsRouter>(replicas, overlap_weight, block_size,
                                              indexed_group);
  }
  return absl::InvalidArgumentError("unknown router kind");
}

}  // namespace kvpage::sim
