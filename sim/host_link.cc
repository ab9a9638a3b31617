// The host tier's link (see host_link.h and docs/simulator.md, "Host tier").
#include "sim/host_link.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "internal/status_macros.h"

namespace kvpage::sim {

HostLink::HostLink(std::vector<int64_t> group_block_bytes, double bytes_per_s)
    : group_block_bytes_(std::move(group_block_bytes)), bytes_per_s_(bytes_per_s) {}

double HostLink::CopySeconds(const std::vector<TierCopy>& copies) const {
  int64_t bytes = 0;
  for (const TierCopy& c : copies) {
    KVPAGE_DCHECK(c.group.value >= 0 &&
                  static_cast<size_t>(c.group.value) < group_block_bytes_.size());
    bytes += group_block_bytes_[static_cast<size_t>(c.group.value)];
  }
  return static_cast<double>(bytes) / bytes_per_s_;
}

double HostLink::Queue(const TierTransfers& transfers, double now_s) {
  const double start = std::max(now_s, free_s_);
  const double save_s = CopySeconds(transfers.saves);
  const double load_s = CopySeconds(transfers.loads);
  free_s_ = start + save_s + load_s;
  busy_s_ += save_s + load_s;
  queue_.push_back({transfers.id, free_s_});
  return transfers.saves.empty() ? now_s : start + save_s;
}

std::vector<uint64_t> HostLink::TakeDone(double now_s) {
  std::vector<uint64_t> done;
  for (; !queue_.empty() && queue_.front().done_s <= now_s; queue_.pop_front()) {
    done.push_back(queue_.front().id);
  }
  return done;
}

double HostLink::next_done_s() const {
  return queue_.empty() ? std::numeric_limits<double>::infinity() : queue_.front().done_s;
}

}  // namespace kvpage::sim
