// KvEventPublisher: a server's KV events on ZeroMQ, the stream vLLM 0.33 publishes with
// `--kv-events-config`, so KV-aware routers (NVIDIA Dynamo's KV router and standalone indexer,
// vllm-router's kv_aware policy, llm-d) can mirror this server's prefix cache.
//
// On `endpoint` a PUB socket sends one 3-frame message per batch:
//
//   [topic, seq (8 bytes, big-endian, 0 for the first batch, +1 per batch), payload]
//
// where payload is EncodeKvEventBatch's (kv_event_wire.h). The last `buffer_steps` payloads
// are kept; on `replay_endpoint` a ROUTER socket answers a request [identity, "", start_seq
// (8 bytes big-endian)] with [identity, "", seq, payload] for every kept batch with
// seq >= start_seq, then the end marker [identity, "", -1 (8 bytes big-endian), ""]. A router
// that sees a gap in seq asks for the missed batches there.
//
// An endpoint that contains "*", "::", "ipc://" or "inproc://" is bound; any other is connected
// to (vLLM's rule): "tcp://*:5557" listens, "tcp://router-host:5557" dials out.
//
// The engine never waits for a router: Publish only moves the events into a bounded queue (a
// full queue drops the batch and counts it), and the publisher's own thread encodes and sends.
// A subscriber that stops reading costs at most `hwm` queued messages in ZeroMQ, after which
// PUB drops for it; memory stays within max_queue_size batches, hwm messages per subscriber
// and buffer_steps payloads.
//
// Thread-safety: Publish, Flush and stats may be called from any thread; the destructor (or
// Shutdown) must not race with them.
#ifndef KVPAGE_KV_EVENT_PUBLISHER_H_
#define KVPAGE_KV_EVENT_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvpage/kv_event_wire.h"
#include "kvpage/kv_events.h"

namespace kvpage {

// Field names and defaults follow vLLM's KVEventsConfig (publisher "zmq").
struct KvEventsConfig {
  std::string endpoint = "tcp://*:5557";       // PUB: bind or connect (see above)
  std::optional<std::string> replay_endpoint;  // ROUTER for replay requests; unset = none
  int32_t buffer_steps = 10000;                // batches kept for replay
  int32_t hwm = 100000;                        // PUB and ROUTER send high-water mark, messages
  int32_t max_queue_size = 100000;             // batches waiting for the publisher thread
  std::string topic;                           // first frame of every message
  int32_t data_parallel_rank = 0;              // the batches' third element
  // How long closing waits for messages still queued in ZeroMQ (ZMQ_LINGER), milliseconds.
  int32_t linger_ms = 1000;

  // InvalidArgument naming the field and value: an endpoint without a tcp://, ipc:// or
  // inproc:// scheme, a replay endpoint equal to the endpoint (unless both end in the wildcard
  // port ":*"), a count below 1, a negative
  // rank or linger.
  absl::Status Validate() const;
};

// True when `endpoint` is bound rather than connected to (vLLM's rule, above).
bool KvEventEndpointBinds(const std::string& endpoint);

struct KvEventPublisherStats {
  int64_t published_batches = 0;  // handed to the PUB socket (= the next sequence number)
  int64_t dropped_batches = 0;    // refused by Publish because the queue was full
  int64_t published_bytes = 0;    // payload bytes handed to the PUB socket
  int64_t replay_requests = 0;    // requests answered on the replay socket
  int64_t encode_errors = 0;      // batches EncodeKvEventBatch refused (logged, not sent)
};

class KvEventPublisher {
 public:
  // Binds or connects the sockets and starts the publisher thread. `groups` describes the
  // event's groups (KvEventGroupInfos); options.data_parallel_rank is taken from `config`.
  // InvalidArgument for a config that fails Validate; Unavailable naming the endpoint when a
  // socket cannot bind or connect (address in use, unknown interface, malformed address).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(
      const KvEventsConfig& config, std::vector<KvEventGroupInfo> groups,
      KvEventWireOptions options = {});

  // Shutdown().
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch (oldest event first) stamped `ts` (seconds since the epoch, as vLLM's
  // time.time()). Never blocks. An empty batch is skipped and takes no sequence number, as
  // vLLM publishes none for a step without events. Returns false (and counts the batch as
  // dropped) when the queue holds max_queue_size batches or the publisher is shut down.
  bool Publish(double ts, std::vector<KvEvent> events);

  // Waits until every batch queued before the call has been handed to the PUB socket, at
  // most `timeout`. False on timeout.
  bool Flush(absl::Duration timeout);

  // Sends what is queued, stops the thread and closes the sockets, waiting at most linger_ms
  // for ZeroMQ to deliver. Idempotent.
  void Shutdown();

  KvEventPublisherStats stats() const;
  // The PUB endpoint as bound or connected, with a wildcard port resolved (e.g.
  // "tcp://127.0.0.1:*" binds a free port and this names it).
  const std::string& endpoint() const;
  // The replay endpoint likewise; empty without one.
  const std::string& replay_endpoint() const;

 private:
  class Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpage

#endif  // KVPAGE_KV_EVENT_PUBLISHER_H_
