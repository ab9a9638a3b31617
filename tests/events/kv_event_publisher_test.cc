// KvEventPublisher against real ZeroMQ sockets: its config checks, bind errors, the 3-frame
// messages and their sequence numbers, replay from the ROUTER socket, and a full queue.
#include "kvpage/kv_event_publisher.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <algorithm>
#include <string>
#include <vector>

namespace kvpage {
namespace {

const std::vector<KvEventGroupInfo> kGroups = {{.block_size = 4, .kind = "full_attention"}};

std::vector<KvEvent> OneStored(uint64_t hash) {
  KvEvent e{KvEvent::Type::kStored, GroupId(0), BlockHash{hash, 0}, BlockHash{}};
  e.token_ids = {1, 2, 3, 4};
  return {e};
}

uint64_t Seq(const std::string& frame) {
  uint64_t v = 0;
  for (unsigned char c : frame) v = (v << 8) | c;
  return v;
}

std::string SeqFrame(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

// Receives one multipart message, waiting at most 5 s for its first frame.
std::vector<std::string> Receive(void* socket) {
  std::vector<std::string> frames;
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, 5000) <= 0) return frames;
  int more = 1;
  while (more != 0) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) break;
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return frames;
}

class Zmq {
 public:
  Zmq() : context_(zmq_ctx_new()) {}
  ~Zmq() {
    for (void* s : sockets_) zmq_close(s);
    zmq_ctx_term(context_);
  }
  void* Socket(int type, const std::string& endpoint) {
    void* s = zmq_socket(context_, type);
    const int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (type == ZMQ_SUB) zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    EXPECT_EQ(zmq_connect(s, endpoint.c_str()), 0) << endpoint;
    sockets_.push_back(s);
    return s;
  }

 private:
  void* context_;
  std::vector<void*> sockets_;
};

TEST(KvEventsConfigTest, ValidateNamesTheBadValue) {
  EXPECT_TRUE(KvEventsConfig{}.Validate().ok());
  auto message = [](const KvEventsConfig& c) { return std::string(c.Validate().message()); };
  KvEventsConfig c;
  c.endpoint = "localhost:5557";
  EXPECT_EQ(message(c),
            "KvEventsConfig.endpoint 'localhost:5557' is not a tcp://, ipc:// or inproc:// "
            "address");
  c = {};
  c.replay_endpoint = "tcp://*:5557";
  EXPECT_EQ(message(c), "KvEventsConfig.replay_endpoint 'tcp://*:5557' is also the endpoint");
  c = {};
  c.buffer_steps = 0;
  EXPECT_EQ(message(c), "KvEventsConfig.buffer_steps must be >= 1, got 0");
  c = {};
  c.hwm = -5;
  EXPECT_EQ(message(c), "KvEventsConfig.hwm must be >= 1, got -5");
  c = {};
  c.max_queue_size = 0;
  EXPECT_EQ(message(c), "KvEventsConfig.max_queue_size must be >= 1, got 0");
  c = {};
  c.data_parallel_rank = -1;
  EXPECT_EQ(message(c), "KvEventsConfig.data_parallel_rank must be >= 0, got -1");
  c = {};
  c.linger_ms = -1;
  EXPECT_EQ(message(c), "KvEventsConfig.linger_ms must be >= 0, got -1");
  EXPECT_EQ(KvEventsConfig{.endpoint = "tcp://*:5557"}.Validate().code(),
            absl::StatusCode::kOk);
}

TEST(KvEventsConfigTest, BindsWildcardsIpcAndInprocAndConnectsOtherwise) {
  EXPECT_TRUE(KvEventEndpointBinds("tcp://*:5557"));
  EXPECT_TRUE(KvEventEndpointBinds("tcp://[::]:5557"));
  EXPECT_TRUE(KvEventEndpointBinds("ipc:///tmp/kv"));
  EXPECT_TRUE(KvEventEndpointBinds("inproc://kv"));
  EXPECT_FALSE(KvEventEndpointBinds("tcp://router-host:5557"));
  EXPECT_FALSE(KvEventEndpointBinds("tcp://127.0.0.1:5557"));
}

TEST(KvEventPublisherTest, AnEndpointThatCannotBindIsAnErrorNamingIt) {
  auto first = KvEventPublisher::Create({.endpoint = "tcp://127.0.0.1:*"}, kGroups);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string port = (*first)->endpoint().substr((*first)->endpoint().rfind(':') + 1);
  const std::string taken = "tcp://*:" + port;
  auto second = KvEventPublisher::Create({.endpoint = taken}, kGroups);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot bind KV events socket to '" + taken + "'"),
            std::string::npos)
      << second.status();
  auto bad_replay = KvEventPublisher::Create(
      {.endpoint = "tcp://127.0.0.1:*", .replay_endpoint = "ipc:///no/such/dir/replay"}, kGroups);
  ASSERT_FALSE(bad_replay.ok());
  EXPECT_NE(bad_replay.status().message().find("'ipc:///no/such/dir/replay'"), std::string::npos)
      << bad_replay.status();
  EXPECT_EQ(KvEventPublisher::Create({.buffer_steps = 0}, kGroups).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvEventPublisherTest, SendsNumberedBatchesAndReplaysWhatItKeeps) {
  auto created = KvEventPublisher::Create({.endpoint = "tcp://127.0.0.1:*",
                                           .replay_endpoint = "tcp://127.0.0.1:*",
                                           .buffer_steps = 5,
                                           .topic = "kv"},
                                          kGroups);
  ASSERT_TRUE(created.ok()) << created.status();
  KvEventPublisher& pub = **created;
  Zmq zmq;
  void* sub = zmq.Socket(ZMQ_SUB, pub.endpoint());
  // A subscription takes a moment to reach the PUB socket: publish until one message arrives.
  std::vector<std::string> first;
  for (uint64_t i = 0; first.empty() && i < 100; ++i) {
    ASSERT_TRUE(pub.Publish(1.0, OneStored(i)));
    zmq_pollitem_t item{sub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) > 0) first = Receive(sub);
  }
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0], "kv");
  uint64_t expect = Seq(first[1]);
  EXPECT_TRUE(pub.Publish(2.0, {}));  // empty: skipped, no sequence number
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pub.Publish(3.0 + i, OneStored(1000 + i)));
  // Every later message follows the one before it: the probes still in flight, then the
  // three batches just published.
  int seen = 0;
  while (seen < 3) {
    std::vector<std::string> m = Receive(sub);
    ASSERT_EQ(m.size(), 3u);
    ASSERT_EQ(Seq(m[1]), ++expect);
    absl::StatusOr<WireKvEventBatch> batch = DecodeKvEventBatch(m[2]);
    ASSERT_TRUE(batch.ok()) << batch.status();
    const uint64_t hash = batch->events.at(0).block_hashes.at(0);
    if (hash < 1000) continue;  // a probe
    EXPECT_EQ(hash, 1000u + seen);
    EXPECT_EQ(batch->ts, 3.0 + seen);
    ++seen;
  }
  ASSERT_TRUE(pub.Flush(absl::Seconds(5)));
  const int64_t published = pub.stats().published_batches;
  EXPECT_EQ(static_cast<uint64_t>(published), expect + 1);  // seq starts at 0

  // Replay from 0: only the last buffer_steps = 5 batches are kept, then the end marker.
  void* dealer = zmq.Socket(ZMQ_DEALER, pub.replay_endpoint());
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  const std::string start = SeqFrame(0);
  zmq_send(dealer, start.data(), start.size(), 0);
  std::vector<uint64_t> replayed;
  while (true) {
    std::vector<std::string> m = Receive(dealer);
    ASSERT_EQ(m.size(), 3u);  // "", seq, payload
    EXPECT_EQ(m[0], "");
    if (m[2].empty()) {
      EXPECT_EQ(m[1], std::string(8, '\xff'));  // -1
      break;
    }
    ASSERT_TRUE(DecodeKvEventBatch(m[2]).ok());
    replayed.push_back(Seq(m[1]));
  }
  // The last five, or every batch when the first probe got through at once (4 published).
  std::vector<uint64_t> kept;
  for (int64_t seq = std::max<int64_t>(0, published - 5); seq < published; ++seq) {
    kept.push_back(static_cast<uint64_t>(seq));
  }
  EXPECT_EQ(replayed, kept);
  EXPECT_EQ(pub.stats().replay_requests, 1);
  EXPECT_EQ(pub.stats().dropped_batches, 0);
  EXPECT_GT(pub.stats().published_bytes, 0);
}

// A subscriber that never reads, a queue of one batch: Publish returns at once every time,
// and every batch is either published or counted as dropped.
TEST(KvEventPublisherTest, AStalledRouterNeverBlocksPublish) {
  auto created = KvEventPublisher::Create(
      {.endpoint = "tcp://127.0.0.1:*", .hwm = 1, .max_queue_size = 1, .linger_ms = 0}, kGroups);
  ASSERT_TRUE(created.ok()) << created.status();
  Zmq zmq;
  zmq.Socket(ZMQ_SUB, (*created)->endpoint());  // connected, never read
  int64_t refused = 0;
  for (uint64_t i = 0; i < 5000; ++i) refused += (*created)->Publish(0, OneStored(i)) ? 0 : 1;
  ASSERT_TRUE((*created)->Flush(absl::Seconds(30)));
  const KvEventPublisherStats stats = (*created)->stats();
  EXPECT_EQ(stats.dropped_batches, refused);
  EXPECT_EQ(stats.published_batches + stats.dropped_batches, 5000);
  (*created)->Shutdown();
  EXPECT_FALSE((*created)->Publish(0, OneStored(1)));  // after Shutdown: refused, counted
  EXPECT_EQ((*created)->stats().dropped_batches, refused + 1);
}

}  // namespace
}  // namespace kvpage
