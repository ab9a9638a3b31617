// kvpage_vllm_replay: the kvpage side of the vLLM differential harness (tools/vllm_diff).
//
//   kvpage_vllm_replay layout --model M [--vllm-version V] [--no-enable-prefix-caching]
//       prints the vllm-mode layout as JSON: block size, bytes per block id, the groups
//   kvpage_vllm_replay replay --log FILE
//       replays an op log that vllm_replay.py recorded against vLLM (header line, then one
//       op per line, each with what vLLM answered) through a vllm-mode KvCacheManager and
//       stops at the first answer that differs. Exit 0: no divergence; 1: a divergence
//       (printed); 2: bad input.
//   kvpage_vllm_replay sched --log FILE
//       replays a vllm_sched_replay.py log (vLLM's Scheduler, step by step) through kvpage's
//       Scheduler with vllm accounting and stops at the first step that differs.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvpage/catalog.h"
#include "kvpage/kv_cache_manager.h"
#include "kvpage/scheduler.h"
#include "nlohmann/json.hpp"

namespace kvpage {
namespace {

using nlohmann::json;

struct Options {
  std::string model;
  VllmVersion version = kCurrentVllmVersion;
  bool prefix_caching = true;
  bool async_scheduling = true;
  int32_t max_num_batched_tokens = 8192;
  int32_t block_size = 16;
  int64_t max_model_len = 0;
};

absl::StatusOr<Options> OptionsFromJson(const json& h) {
  Options o;
  o.model = h.at("model").get<std::string>();
  auto version = ParseVllmVersion(h.value("vllm_version", std::string("0.33")));
  if (!version.ok()) return version.status();
  o.version = *version;
  o.prefix_caching = h.value("enable_prefix_caching", true);
  o.async_scheduling = h.value("async_scheduling", true);
  o.max_num_batched_tokens = h.value("max_num_batched_tokens", 8192);
  o.block_size = h.value("block_size", 16);
  o.max_model_len = h.value("max_model_len", int64_t{0});
  return o;
}

KvCacheConfig ConfigFor(const Options& o, int64_t budget) {
  KvCacheConfig c;
  c.mode = AccountingMode::kVllm;
  c.vllm_version = o.version;
  c.kv_budget_bytes = budget;
  c.block_size = o.block_size;
  c.enable_prefix_caching = o.prefix_caching;
  c.async_scheduling = o.async_scheduling;
  c.max_num_batched_tokens = o.max_num_batched_tokens;
  c.max_model_len = o.max_model_len;
  c.hash_seed = 0;
  return c;
}

// Bytes one block id costs: from a manager with room for a few blocks.
absl::StatusOr<int64_t> BlockIdBytes(const ModelSpec& model, const Options& o) {
  auto probe = KvCacheManager::Create(model, ConfigFor(o, int64_t{1} << 40));
  if (!probe.ok()) return probe.status();
  return (*probe)->Usage().pools.at(0).block_bytes;
}

// What a log header (or the layout command's flags) sets up: the options, the model and the
// bytes of one block id.
struct Setup {
  json header;
  Options options;
  ModelSpec model;
  int64_t block_bytes = 0;
};

absl::StatusOr<Setup> SetupFromJson(json h) {
  Setup s;
  s.header = std::move(h);
  absl::StatusOr<Options> o = OptionsFromJson(s.header);
  if (!o.ok()) return o.status();
  s.options = *std::move(o);
  absl::StatusOr<ModelSpec> model = LoadModel(s.options.model);
  if (!model.ok()) return model.status();
  s.model = *std::move(model);
  absl::StatusOr<int64_t> bytes = BlockIdBytes(s.model, s.options);
  if (!bytes.ok()) return bytes.status();
  s.block_bytes = *bytes;
  return s;
}

// Reads a log's first line (its header) from `in` and sets it up; prints why not.
std::optional<Setup> ReadLogHeader(std::istream& in, const std::string& path) {
  std::string line;
  if (!in || !std::getline(in, line)) {
    std::cerr << "cannot read " << path << "\n";
    return std::nullopt;
  }
  absl::StatusOr<Setup> s = SetupFromJson(json::parse(line));
  if (!s.ok()) {
    std::cerr << s.status().message() << "\n";
    return std::nullopt;
  }
  return *std::move(s);
}

// The per-layer cache specs vLLM registers for a model with DeepSeek-V3.2's indexer: each MLA
// layer's latent (head_size values of the KV cache dtype) and its indexer cache layer (132 uint8
// a token, DeepseekV32IndexerCache), so that vllm_replay.py can let vLLM group them itself.
// Empty for other models, whose groups the layout's "groups" give.
json VllmLayerSpecs(const ModelSpec& model) {
  json specs = json::array();
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const AttentionShape& a = model.layers[i].attention;
    if (model.layers[i].kind != LayerKind::kMla || !a.HasIndexer()) return json::array();
    const std::string layer = absl::StrCat("model.layers.", i, ".self_attn");
    specs.push_back({{"name", layer + ".attn"}, {"head_size", a.head_dim_k},
                     {"dtype", std::string(DTypeName(model.dtype))}});
    specs.push_back({{"name", layer + ".indexer.k_cache"},
                     {"head_size", a.index_head_dim + a.index_head_dim / 128 * 4},
                     {"dtype", "uint8"}});
  }
  return specs;
}

json Layout(const ModelSpec& model, const Options& o, int64_t block_bytes) {
  auto m = KvCacheManager::Create(model, ConfigFor(o, block_bytes * 8));
  json groups = json::array();
  for (int32_t g = 0; g < (*m)->num_groups(); ++g) {
    groups.push_back({{"kind", std::string(LayerKindName((*m)->group_kind(GroupId(g))))},
                      {"block_size", (*m)->group_block_size(GroupId(g))},
                      {"window", (*m)->group_window(GroupId(g))}});
  }
  int32_t block_size = o.block_size;
  for (const json& g : groups) {
    if (g["block_size"].get<int32_t>() > 0) block_size = g["block_size"].get<int32_t>();
  }
  return {{"model", model.name},
          {"block_size", block_size},
          {"block_id_bytes", block_bytes},
          {"max_model_len", o.max_model_len > 0 ? o.max_model_len : model.max_position_embeddings},
          {"groups", groups},
          {"vllm_layer_specs", VllmLayerSpecs(model)}};
}

// Ids a recurrent group's request holds, as a sorted set (vLLM's position-indexed list
// without its null entries).
std::vector<int32_t> StateIds(const KvCacheManager& m, RequestHandle h, GroupId g) {
  std::set<int32_t> ids;
  auto s = m.GetStateSlots(h, g);
  if (s.ok()) {
    if (s->read_slot > 0) ids.insert(s->read_slot);
    if (s->write_slot > 0) ids.insert(s->write_slot);
  }
  return {ids.begin(), ids.end()};
}

json Tables(const KvCacheManager& m, RequestHandle h) {
  json tables = json::array();
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    if (m.group_block_size(GroupId(g)) == 0) {
      tables.push_back(StateIds(m, h, GroupId(g)));
      continue;
    }
    std::vector<int32_t> ids;
    auto t = m.BlockTable(h, GroupId(g));
    if (t.ok()) {
      for (BlockId b : *t) ids.push_back(b.value);
    }
    tables.push_back(ids);
  }
  return tables;
}

json FreeOrder(const KvCacheManager& m) {
  std::vector<int32_t> ids;
  for (BlockId b : m.FreeBlockOrder(GroupId(0))) ids.push_back(b.value);
  return ids;
}

// vLLM's hit lists, recurrent groups reduced to their last (the state) entry.
json HitBlocks(const KvCacheManager& m, const CacheHit& hit) {
  json out = json::array();
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    std::vector<int32_t> ids;
    for (BlockId b : hit.blocks[g]) ids.push_back(b.value);
    if (m.group_block_size(GroupId(g)) == 0) {
      if (!ids.empty() && ids.back() > 0) ids = {ids.back()};
      else ids.clear();
    }
    out.push_back(ids);
  }
  return out;
}

class Replayer {
 public:
  explicit Replayer(std::unique_ptr<KvCacheManager> m) : m_(std::move(m)) {}

  // The answer kvpage gives to `op`, in the shape vLLM's answer was recorded.
  absl::StatusOr<json> Apply(const json& op) {
    const std::string kind = op.at("op");
    if (kind == "step") {
      m_->NewStep();
      return json::object();
    }
    const std::string req = op.at("req");
    if (kind == "add") {
      KvRequestSpec spec;
      spec.id = RequestId(next_id_++);
      spec.prompt_tokens = op.at("tokens").get<std::vector<int32_t>>();
      auto h = m_->AddRequest(std::move(spec));
      if (!h.ok()) return h.status();
      handles_[req] = *h;
      return json::object();
    }
    auto it = handles_.find(req);
    if (it == handles_.end()) return absl::NotFoundError(absl::StrCat("no request ", req));
    const RequestHandle h = it->second;
    if (kind == "hit") {
      auto hit = m_->GetComputedBlocks(h);
      if (!hit.ok()) return hit.status();
      hits_[req] = *hit;
      return json{{"tokens", hit->num_tokens}, {"blocks", HitBlocks(*m_, *hit)}};
    }
    if (kind == "alloc") {
      AllocationRequest a;
      a.num_computed_tokens = op.at("computed");
      a.num_new_tokens = op.at("new");
      if (op.value("use_hit", false)) a.hit = &hits_.at(req);
      auto ok = m_->AllocateSlots(h, a);
      if (!ok.ok()) return ok.status();
      json r{{"ok", *ok}, {"free", FreeOrder(*m_).size()}};
      if (*ok) r["tables"] = Tables(*m_, h);
      return r;
    }
    if (kind == "append") {
      const int32_t token = op.at("token");
      if (absl::Status s = m_->AppendTokens(h, {&token, 1}); !s.ok()) return s;
      return json::object();
    }
    if (kind == "free") {
      if (absl::Status s = m_->Free(h); !s.ok()) return s;
      handles_.erase(it);
      hits_.erase(req);
      return json{{"free_order", FreeOrder(*m_)}};
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown op '", kind, "'"));
  }

  absl::Status Check() const { return m_->CheckInvariants(); }

 private:
  std::unique_ptr<KvCacheManager> m_;
  std::map<std::string, RequestHandle> handles_;
  std::map<std::string, CacheHit> hits_;
  int64_t next_id_ = 0;
};

int Replay(const std::string& path) {
  std::ifstream in(path);
  const std::optional<Setup> setup = ReadLogHeader(in, path);
  if (!setup) return 2;
  const int64_t num_blocks = setup->header.at("num_blocks");
  auto m = KvCacheManager::Create(setup->model,
                                  ConfigFor(setup->options, num_blocks * setup->block_bytes));
  std::string line;
  if (!m.ok()) {
    std::cerr << m.status().message() << "\n";
    return 2;
  }
  Replayer r(*std::move(m));
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    const json op = json::parse(line);
    auto got = r.Apply(op);
    const json want = op.value("expect", json::object());
    if (!got.ok()) {
      std::cout << "DIVERGENCE at op " << n << " " << op.dump().substr(0, 300)
                << "\n  kvpage error: " << got.status().message() << "\n";
      return 1;
    }
    for (auto& [key, value] : want.items()) {
      if (!got->contains(key) || (*got)[key] != value) {
        std::cout << "DIVERGENCE at op " << n << " (" << op.at("op") << " "
                  << op.value("req", std::string()) << ") field '" << key
                  << "'\n  vllm:   " << value.dump().substr(0, 600) << "\n  kvpage: "
                  << (got->contains(key) ? (*got)[key].dump().substr(0, 600) : "(none)") << "\n";
        return 1;
      }
    }
    if (absl::Status s = r.Check(); !s.ok()) {
      std::cout << "kvpage invariant broken after op " << n << ": " << s.message() << "\n";
      return 1;
    }
  }
  std::cout << "OK: " << n << " ops, no divergence\n";
  return 0;
}

std::string Name(RequestId id) { return absl::StrCat("r", id.value); }

// Compares one kvpage step with vLLM's recorded one (tokens per request and where each
// started, preemptions, free blocks after scheduling and their order, who samples); fills
// `result` with vLLM's sampled tokens. False (and prints) on a divergence. `to_vllm` renames
// kvpage's block ids to vLLM's: Scheduler::Create probes the cache with a max_model_len
// request, which leaves the free blocks (all uncached, so interchangeable) in another order
// than vLLM's 1, 2, ..., N - 1, so the i-th free block at the start is vLLM's i + 1.
bool CompareStep(const SchedulerOutput& out, const KvCacheManager& kv, const json& op,
                 int64_t step, const std::vector<int32_t>& to_vllm, ModelOutput& result) {
  json scheduled = json::array();
  json computed = json::array();
  for (const ScheduledRequest& r : out.requests) {
    scheduled.push_back({Name(r.id), r.num_scheduled_tokens});
    computed.push_back({Name(r.id), r.num_computed_tokens});
  }
  std::sort(scheduled.begin(), scheduled.end());
  std::sort(computed.begin(), computed.end());
  // The free queue's order, hashed as vllm_sched_replay.py hashes it.
  std::vector<int32_t> free_order;
  for (BlockId b : kv.FreeBlockOrder(GroupId(0))) {
    const size_t id = static_cast<size_t>(b.value);
    free_order.push_back(id < to_vllm.size() ? to_vllm[id] : -1);
  }
  uint64_t free_hash = 0;
  for (int32_t b : free_order) {
    free_hash = (free_hash * 1000003 + static_cast<uint64_t>(b) + 1) % (uint64_t{1} << 40);
  }
  std::vector<std::string> preempted;
  for (RequestId id : out.preempted_ids) preempted.push_back(Name(id));
  std::sort(preempted.begin(), preempted.end());
  json got{{"scheduled", scheduled},
           {"computed", computed},
           {"preempted", preempted},
           {"free", free_order.size()},
           {"free_hash", free_hash}};
  if (op.at("expect").contains("free_order")) got["free_order"] = free_order;
  for (const char* key : {"scheduled", "computed", "preempted", "free", "free_order", "free_hash"}) {
    if (!op.at("expect").contains(key) || got[key] == op.at("expect")[key]) continue;
    json want = op.at("expect")[key], have = got[key];
    size_t at = 0;  // a list is shown from its first difference on
    if (want.is_array() && have.is_array()) {
      while (at < want.size() && at < have.size() && want[at] == have[at]) ++at;
      auto tail = [at](const json& v) {
        return json(std::vector<json>(v.begin() + static_cast<ptrdiff_t>(std::min(at, v.size())),
                                      v.end()));
      };
      want = tail(want);
      have = tail(have);
    }
    std::cout << "DIVERGENCE at step " << step << " field '" << key << "'"
              << (at > 0 ? absl::StrCat(" from entry ", at) : "") << "\n  vllm:   "
              << want.dump().substr(0, 600) << "\n  kvpage: " << have.dump().substr(0, 600) << "\n";
    return false;
  }
  const json& sampled = op.at("sampled");
  result.sampled_offsets.push_back(0);
  for (const ScheduledRequest& r : out.requests) {
    if (r.samples != sampled.contains(Name(r.id))) {
      std::cout << "DIVERGENCE at step " << step << ": " << Name(r.id)
                << (r.samples ? " samples in kvpage only\n" : " samples in vLLM only\n");
      return false;
    }
    if (r.samples) result.sampled_token_ids.push_back(sampled.at(Name(r.id)));
    result.sampled_offsets.push_back(static_cast<int32_t>(result.sampled_token_ids.size()));
  }
  return true;
}

// Replays a vllm_sched_replay.py log through kvpage's Scheduler: the same requests, each
// step's sampled tokens as vLLM's, and each step's schedule compared with vLLM's. A log of
// vLLM's AsyncScheduler ("async_scheduling" in its header) runs with async scheduling: each
// step is scheduled (and compared) before the previous one is updated.
int ReplaySchedule(const std::string& path) {
  std::ifstream in(path);
  const std::optional<Setup> setup = ReadLogHeader(in, path);
  if (!setup) return 2;
  const json& header = setup->header;
  SchedulerConfig c;
  c.kv = ConfigFor(setup->options, header.at("num_blocks").get<int64_t>() * setup->block_bytes);
  c.async_scheduling = header.value("async_scheduling", false);
  c.kv.async_scheduling = c.async_scheduling;  // vLLM's sliding-window bound follows it
  c.max_num_batched_tokens = header.at("max_num_batched_tokens");
  c.max_num_seqs = header.at("max_num_seqs");
  c.max_model_len = header.at("max_model_len");
  auto sched = Scheduler::Create(setup->model, c);
  if (!sched.ok()) {
    std::cerr << sched.status().message() << "\n";
    return 2;
  }
  std::vector<int32_t> to_vllm;
  const std::vector<BlockId> initial = (*sched)->kv_cache().FreeBlockOrder(GroupId(0));
  for (size_t i = 0; i < initial.size(); ++i) {
    const size_t id = static_cast<size_t>(initial[i].value);
    if (to_vllm.size() <= id) to_vllm.resize(id + 1, -1);
    to_vllm[id] = static_cast<int32_t>(i) + 1;
  }
  std::string line;
  int64_t n = 0, steps = 0;
  std::map<std::string, std::vector<int32_t>> prompts;
  const SchedulerOutput* in_flight = nullptr;  // async: scheduled, not updated yet
  ModelOutput in_flight_result;
  auto update = [&](const SchedulerOutput& out, const ModelOutput& result) {
    if (auto u = (*sched)->Update(out, result); !u.ok()) {
      std::cout << "kvpage Update failed at step " << out.step - 1 << ": " << u.status().message()
                << "\n";
      return false;
    }
    if (absl::Status s = (*sched)->CheckInvariants(); !s.ok()) {
      std::cout << "kvpage invariant broken at step " << out.step - 1 << ": " << s.message()
                << "\n";
      return false;
    }
    return true;
  };
  while (std::getline(in, line)) {
    ++n;
    const json op = json::parse(line);
    if (op.at("op") == "add") {
      RequestSpec spec;
      spec.id = RequestId(std::stoll(op.at("req").get<std::string>().substr(1)));
      spec.prompt_token_ids = op.at("tokens").get<std::vector<int32_t>>();
      prompts[op.at("req").get<std::string>()] = spec.prompt_token_ids;
      spec.max_new_tokens = op.at("max_tokens");
      if (absl::Status s = (*sched)->AddRequest(std::move(spec)); !s.ok()) {
        std::cout << "DIVERGENCE at op " << n << ": kvpage refused " << op.at("req") << ": "
                  << s.message() << "\n";
        return 1;
      }
      continue;
    }
    const SchedulerOutput& out = (*sched)->Schedule();
    ModelOutput result;
    if (!CompareStep(out, (*sched)->kv_cache(), op, steps, to_vllm, result)) {
      // What kvpage's cache holds for the requests only vLLM scheduled.
      std::set<std::string> mine;
      for (const ScheduledRequest& r : out.requests) mine.insert(Name(r.id));
      for (const json& e : op.at("expect").at("scheduled")) {
        const std::string id = e[0].get<std::string>();
        if (mine.contains(id)) continue;
        std::cout << "  " << id << ": kvpage's cache holds "
                  << (*sched)->kv_cache().CachedPrefixTokens(prompts[id]) << " of its "
                  << prompts[id].size() << " prompt tokens; "
                  << (*sched)->kv_cache().FreeBlockOrder(GroupId(0)).size() << " free blocks\n";
      }
      return 1;
    }
    ++steps;
    if (!c.async_scheduling) {
      if (!update(out, result)) return 1;
      continue;
    }
    if (in_flight != nullptr && !update(*in_flight, in_flight_result)) return 1;
    in_flight = &out;
    in_flight_result = std::move(result);
    if (!(*sched)->HasUnfinishedRequests()) {  // the last step, as vllm_sched_replay.py ends
      if (!update(*in_flight, in_flight_result)) return 1;
      in_flight = nullptr;
    }
  }
  if ((*sched)->HasUnfinishedRequests()) {
    std::cout << "DIVERGENCE: vLLM finished every request after " << steps
              << " steps; kvpage has some left\n";
    return 1;
  }
  std::cout << "OK: " << steps << " steps, " << (*sched)->stats().preemptions
            << " preemptions, no divergence\n";
  return 0;
}

int PrintLayout(int argc, char** argv) {
  json h{{"model", ""}};
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") h["model"] = next();
    else if (a == "--vllm-version") h["vllm_version"] = next();
    else if (a == "--no-enable-prefix-caching") h["enable_prefix_caching"] = false;
    else if (a == "--max-model-len") h["max_model_len"] = std::stoll(next());
    else {
      std::cerr << "unknown flag " << a << "\n";
      return 2;
    }
  }
  const absl::StatusOr<Setup> s = SetupFromJson(h);
  if (!s.ok()) {
    std::cerr << s.status().message() << "\n";
    return 2;
  }
  std::cout << Layout(s->model, s->options, s->block_bytes).dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace kvpage

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "layout") return kvpage::PrintLayout(argc, argv);
  if (cmd == "replay" && argc == 4 && std::string(argv[2]) == "--log") {
    return kvpage::Replay(argv[3]);
  }
  if (cmd == "sched" && argc == 4 && std::string(argv[2]) == "--log") {
    return kvpage::ReplaySchedule(argv[3]);
  }
  std::cerr << "usage: kvpage_vllm_replay layout --model M [--vllm-version V] "
               "[--no-enable-prefix-caching] [--max-model-len N]\n"
               "       kvpage_vllm_replay replay --log FILE\n"
               "       kvpage_vllm_replay sched --log FILE\n";
  return 2;
}
