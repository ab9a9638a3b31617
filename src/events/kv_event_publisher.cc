// KvEventPublisher over libzmq's C API. The sockets are made and bound in Create, so a bad
// endpoint is reported to the caller, and from then on used only by the publisher thread
// (ZeroMQ sockets are not thread-safe; the thread's start orders the hand-over).
#include "kvpage/kv_event_publisher.h"

#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kvpage {
namespace {

// How long the thread sleeps between replay-socket polls when no batch is queued.
constexpr auto kReplayPoll = std::chrono::milliseconds(10);

void BigEndian64(uint64_t v, unsigned char out[8]) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(v & 0xff);
    v >>= 8;
  }
}

absl::Status CheckEndpoint(const std::string& field, const std::string& endpoint) {
  for (const char* scheme : {"tcp://", "ipc://", "inproc://"}) {
    if (absl::StartsWith(endpoint, scheme) && endpoint.size() > std::strlen(scheme)) {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "KvEventsConfig.", field, " '", endpoint, "' is not a tcp://, ipc:// or inproc:// address"));
}

absl::Status CheckAtLeast(const char* field, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("KvEventsConfig.", field, " must be >= ", min, ", got ", value));
}

// A socket of `type`, with its send high-water mark and linger set, bound or connected to
// `endpoint`. Unavailable naming the endpoint on failure (the socket is then closed).
absl::StatusOr<void*> OpenSocket(void* context, int type, const std::string& endpoint,
                                 const KvEventsConfig& config, std::string* resolved) {
  void* socket = zmq_socket(context, type);
  if (socket == nullptr) {
    return absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(zmq_errno())));
  }
  const int hwm = config.hwm;
  const int linger = config.linger_ms;
  zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger));
  const bool bind = KvEventEndpointBinds(endpoint);
  if ((bind ? zmq_bind(socket, endpoint.c_str()) : zmq_connect(socket, endpoint.c_str())) != 0) {
    const int err = zmq_errno();
    zmq_close(socket);
    return absl::UnavailableError(absl::StrCat("cannot ", bind ? "bind" : "connect",
                                               " KV events socket to '", endpoint,
                                               "': ", zmq_strerror(err)));
  }
  char last[256] = {};
  size_t size = sizeof(last);
  if (bind && zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, last, &size) == 0 && last[0] != '\0') {
    *resolved = last;
  } else {
    *resolved = endpoint;
  }
  return socket;
}

// Reads one whole multipart message; false when none is waiting.
bool ReceiveMultipart(void* socket, std::vector<std::string>& frames) {
  frames.clear();
  int more = 1;
  while (more != 0) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(&msg);
      return false;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return true;
}

}  // namespace

absl::Status KvEventsConfig::Validate() const {
  if (absl::Status s = CheckEndpoint("endpoint", endpoint); !s.ok()) return s;
  if (replay_endpoint.has_value()) {
    if (absl::Status s = CheckEndpoint("replay_endpoint", *replay_endpoint); !s.ok()) return s;
    // Two wildcard ports ("tcp://127.0.0.1:*") bind two free ports.
    if (*replay_endpoint == endpoint && !absl::EndsWith(endpoint, ":*")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvEventsConfig.replay_endpoint '", *replay_endpoint, "' is also the endpoint"));
    }
  }
  if (absl::Status s = CheckAtLeast("buffer_steps", buffer_steps, 1); !s.ok()) return s;
  if (absl::Status s = CheckAtLeast("hwm", hwm, 1); !s.ok()) return s;
  if (absl::Status s = CheckAtLeast("max_queue_size", max_queue_size, 1); !s.ok()) return s;
  if (absl::Status s = CheckAtLeast("data_parallel_rank", data_parallel_rank, 0); !s.ok()) {
    return s;
  }
  return CheckAtLeast("linger_ms", linger_ms, 0);
}

bool KvEventEndpointBinds(const std::string& endpoint) {
  return absl::StrContains(endpoint, "*") || absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") || absl::StartsWith(endpoint, "inproc://");
}

class KvEventPublisher::Impl {
 public:
  Impl(const KvEventsConfig& config, std::vector<KvEventGroupInfo> groups,
       KvEventWireOptions options)
      : config_(config), groups_(std::move(groups)), options_(std::move(options)) {
    options_.data_parallel_rank = config.data_parallel_rank;
  }
  ~Impl() { Shutdown(); }

  absl::Status Open();
  bool Publish(double ts, std::vector<KvEvent> events);
  bool Flush(absl::Duration timeout);
  void Shutdown();
  KvEventPublisherStats stats() const;

  std::string endpoint;
  std::string replay_endpoint;

 private:
  struct Batch {
    double ts = 0;
    std::vector<KvEvent> events;
  };

  void Run();                  // the publisher thread
  void Send(const Batch& b);   // encodes, sends on PUB, keeps for replay
  void ServeReplay();          // answers every pending replay request
  void CloseSockets();

  const KvEventsConfig config_;
  const std::vector<KvEventGroupInfo> groups_;
  KvEventWireOptions options_;

  mutable std::mutex mu_;
  std::condition_variable wake_;     // a batch was queued, or stop
  std::condition_variable drained_;  // the thread finished a batch
  std::deque<Batch> queue_;          // guarded by mu_
  int64_t queued_total_ = 0;         // batches ever queued (mu_)
  int64_t sent_total_ = 0;           // batches ever taken off the queue and handled (mu_)
  bool stop_ = false;                // (mu_)
  bool shut_ = false;                // Shutdown ran (mu_)

  // The thread's own.
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> kept_;  // the last buffer_steps payloads
  std::thread thread_;

  std::atomic<int64_t> published_{0};
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> replays_{0};
  std::atomic<int64_t> encode_errors_{0};
};

absl::Status KvEventPublisher::Impl::Open() {
  context_ = zmq_ctx_new();
  if (context_ == nullptr) return absl::InternalError("zmq_ctx_new failed");
  absl::StatusOr<void*> pub = OpenSocket(context_, ZMQ_PUB, config_.endpoint, config_, &endpoint);
  if (!pub.ok()) return pub.status();
  pub_ = *pub;
  if (config_.replay_endpoint.has_value()) {
    absl::StatusOr<void*> replay =
        OpenSocket(context_, ZMQ_ROUTER, *config_.replay_endpoint, config_, &replay_endpoint);
    if (!replay.ok()) return replay.status();
    replay_ = *replay;
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

bool KvEventPublisher::Impl::Publish(double ts, std::vector<KvEvent> events) {
  if (events.empty()) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || static_cast<int64_t>(queue_.size()) >= config_.max_queue_size) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queue_.push_back(Batch{ts, std::move(events)});
    ++queued_total_;
  }
  wake_.notify_one();
  return true;
}

bool KvEventPublisher::Impl::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = queued_total_;
  return drained_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [&] { return sent_total_ >= target; });
}

void KvEventPublisher::Impl::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    while (!queue_.empty()) {
      Batch b = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Send(b);
      lock.lock();
      ++sent_total_;
      drained_.notify_all();
    }
    if (stop_) break;
    lock.unlock();
    if (replay_ != nullptr) ServeReplay();
    lock.lock();
    if (!queue_.empty() || stop_) continue;
    if (replay_ != nullptr) {
      wake_.wait_for(lock, kReplayPoll);
    } else {
      wake_.wait(lock, [&] { return !queue_.empty() || stop_; });
    }
  }
}

void KvEventPublisher::Impl::Send(const Batch& b) {
  absl::StatusOr<std::string> payload = EncodeKvEventBatch(b.ts, b.events, groups_, options_);
  if (!payload.ok()) {
    encode_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("KV events: batch not published: {}", payload.status().ToString());
    return;
  }
  unsigned char seq[8];
  BigEndian64(next_seq_, seq);
  // PUB never blocks: a subscriber past its high-water mark misses the message and, seeing the
  // gap in seq, asks the replay socket for it.
  zmq_send(pub_, config_.topic.data(), config_.topic.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(pub_, payload->data(), payload->size(), ZMQ_DONTWAIT);
  published_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(static_cast<int64_t>(payload->size()), std::memory_order_relaxed);
  kept_.emplace_back(next_seq_, *std::move(payload));
  if (static_cast<int64_t>(kept_.size()) > config_.buffer_steps) kept_.pop_front();
  ++next_seq_;
}

void KvEventPublisher::Impl::ServeReplay() {
  std::vector<std::string> frames;
  while (ReceiveMultipart(replay_, frames)) {
    if (frames.size() != 3 || frames[2].size() != 8) {
      spdlog::warn("KV events: ignoring a replay request of {} frames", frames.size());
      continue;
    }
    uint64_t start = 0;
    for (unsigned char c : frames[2]) start = (start << 8) | c;
    replays_.fetch_add(1, std::memory_order_relaxed);
    const std::string& identity = frames[0];
    auto reply = [&](const void* seq, size_t seq_size, const std::string& payload) {
      zmq_send(replay_, identity.data(), identity.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(replay_, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(replay_, seq, seq_size, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(replay_, payload.data(), payload.size(), ZMQ_DONTWAIT);
    };
    unsigned char seq[8];
    for (const auto& [s, payload] : kept_) {
      if (s < start) continue;
      BigEndian64(s, seq);
      reply(seq, sizeof(seq), payload);
    }
    BigEndian64(~uint64_t{0}, seq);  // -1 as a signed 64-bit big-endian integer
    reply(seq, sizeof(seq), std::string());
  }
}

void KvEventPublisher::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_) return;
    shut_ = true;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  CloseSockets();
}

void KvEventPublisher::Impl::CloseSockets() {
  // Each socket's ZMQ_LINGER bounds how long zmq_ctx_term waits for unsent messages.
  if (pub_ != nullptr) zmq_close(pub_);
  if (replay_ != nullptr) zmq_close(replay_);
  pub_ = replay_ = nullptr;
  if (context_ != nullptr) zmq_ctx_term(context_);
  context_ = nullptr;
}

KvEventPublisherStats KvEventPublisher::Impl::stats() const {
  return KvEventPublisherStats{.published_batches = published_.load(),
                               .dropped_batches = dropped_.load(),
                               .published_bytes = bytes_.load(),
                               .replay_requests = replays_.load(),
                               .encode_errors = encode_errors_.load()};
}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    const KvEventsConfig& config, std::vector<KvEventGroupInfo> groups,
    KvEventWireOptions options) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>(config, std::move(groups), std::move(options));
  if (absl::Status s = impl->Open(); !s.ok()) return s;  // ~Impl closes what was opened
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvEventPublisher::~KvEventPublisher() { Shutdown(); }
bool KvEventPublisher::Publish(double ts, std::vector<KvEvent> events) {
  return impl_->Publish(ts, std::move(events));
}
bool KvEventPublisher::Flush(absl::Duration timeout) { return impl_->Flush(timeout); }
void KvEventPublisher::Shutdown() { impl_->Shutdown(); }
KvEventPublisherStats KvEventPublisher::stats() const { return impl_->stats(); }
const std::string& KvEventPublisher::endpoint() const { return impl_->endpoint; }
const std::string& KvEventPublisher::replay_endpoint() const { return impl_->replay_endpoint; }

}  // namespace kvpage
