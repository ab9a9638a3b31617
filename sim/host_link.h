// HostLink: the PCIe link between one simulated replica's GPU and its host tier.
//
// The copies of every TierTransfers a step hands over (SchedulerOutput::transfers) queue on one
// link and run one after another at a fixed rate, saves (device -> host) and loads (host ->
// device) in turn, as a single copy stream would run them: a transfer starts when the link has
// finished the transfers queued before it, copies its saves, then its loads (a write-back save
// reads a block that a load of the same transfer may then overwrite), and is done when its
// last copy ends. A copy moves the bytes of one block of its group's pool.
//
// Thread-compatible.
#ifndef KVPAGE_SIM_HOST_LINK_H_
#define KVPAGE_SIM_HOST_LINK_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "kvpage/kv_cache_manager.h"

namespace kvpage::sim {

class HostLink {
 public:
  // `group_block_bytes[g]`: bytes of one block of group g's pool (KvCacheUsage::pools, which
  // lists the groups in order). REQUIRES: bytes_per_s > 0 and finite.
  HostLink(std::vector<int64_t> group_block_bytes, double bytes_per_s);

  // Queues `transfers` (id != 0), handed over at `now_s`. Returns when its saves end on the
  // link: the time a forward pass that must wait for them can start (now_s if it has none).
  // REQUIRES: every copy names a group of the manager; now_s no earlier than the last call's.
  double Queue(const TierTransfers& transfers, double now_s);
  // Ids of the queued transfers whose copies have all ended by `now_s`, oldest first; they
  // leave the queue.
  std::vector<uint64_t> TakeDone(double now_s);

  bool empty() const { return queue_.empty(); }
  // When the oldest queued transfer is done; +infinity when none is queued.
  double next_done_s() const;
  // Seconds the link has spent copying, over everything queued so far.
  double busy_s() const { return busy_s_; }

 private:
  struct Queued {
    uint64_t id = 0;
    double done_s = 0;
  };
  double CopySeconds(const std::vector<TierCopy>& copies) const;

  const std::vector<int64_t> group_block_bytes_;
  const double bytes_per_s_;
  std::deque<Queued> queue_;  // done_s non-decreasing: the link is FIFO
  double free_s_ = 0;         // when the link finishes what is queued
  double busy_s_ = 0;
};

}  // namespace kvpage::sim

#endif  // KVPAGE_SIM_HOST_LINK_H_
