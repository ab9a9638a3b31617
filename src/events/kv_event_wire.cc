// Encoding KV events as vLLM 0.33's KVEventBatch payload (msgpack-c's packer writes every
// value in its shortest form, as msgspec does), and the group table the encoder reads.
#include "kvpage/kv_event_wire.h"

#include <msgpack.hpp>


#include "absl/strings/str_cat.h"

namespace kvpage {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackString(Packer& pk, absl::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Does `next` go out in the same wire event as `prev`? A Stored event joins a Stored run of its
// group that it extends (same adapter, same tokens per hash); a Removed event joins a Removed
// run of its group.
bool JoinsRun(const KvEvent& prev, const KvEvent& next) {
  if (prev.type != next.type || prev.group != next.group || prev.medium != next.medium) {
    return false;
  }
  switch (next.type) {
    case KvEvent::Type::kStored:
      return next.has_parent && next.parent == prev.hash && next.lora_id == prev.lora_id &&
             !next.token_ids.empty() && next.token_ids.size() == prev.token_ids.size();
    case KvEvent::Type::kRemoved: return true;
    case KvEvent::Type::kAllCleared: return false;
  }
  return false;
}

// The wire's medium of a run: the host tier is "CPU", the device the options' name.
absl::string_view Medium(const KvEvent& e, const KvEventWireOptions& options) {
  return e.medium == KvMedium::kHost ? absl::string_view("CPU") : options.medium;
}

void PackHashes(Packer& pk, absl::Span<const KvEvent> run) {
  pk.pack_array(static_cast<uint32_t>(run.size()));
  for (const KvEvent& e : run) pk.pack_uint64(ExternalBlockId(e.hash));
}

// BlockStored: type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
// lora_name, group_idx, kv_cache_spec_kind[, kv_cache_spec_sliding_window].
void PackStored(Packer& pk, absl::Span<const KvEvent> run, const KvEventGroupInfo& group,
                const KvEventWireOptions& options) {
  const KvEvent& first = run.front();
  pk.pack_map(group.sliding_window.has_value() ? 11 : 10);
  PackString(pk, "type");
  PackString(pk, "BlockStored");
  PackString(pk, "block_hashes");
  PackHashes(pk, run);
  PackString(pk, "parent_block_hash");
  if (first.has_parent) {
    pk.pack_uint64(ExternalBlockId(first.parent));
  } else {
    pk.pack_nil();
  }
  PackString(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(first.token_ids.size() * run.size()));
  for (const KvEvent& e : run) {
    for (int32_t t : e.token_ids) pk.pack_int32(t);
  }
  PackString(pk, "block_size");
  pk.pack_int32(first.token_ids.empty() ? group.block_size
                                         : static_cast<int32_t>(first.token_ids.size()));
  PackString(pk, "lora_id");
  if (first.lora_id != 0) {
    pk.pack_int64(first.lora_id);
  } else {
    pk.pack_nil();
  }
  PackString(pk, "medium");
  PackString(pk, Medium(first, options));
  PackString(pk, "lora_name");
  const auto name = options.lora_names.find(first.lora_id);
  if (first.lora_id != 0 && name != options.lora_names.end()) {
    PackString(pk, name->second);
  } else {
    pk.pack_nil();
  }
  PackString(pk, "group_idx");
  pk.pack_int32(first.group.value);
  PackString(pk, "kv_cache_spec_kind");
  PackString(pk, group.kind);
  if (group.sliding_window.has_value()) {
    PackString(pk, "kv_cache_spec_sliding_window");
    pk.pack_int32(*group.sliding_window);
  }
}

// BlockRemoved: type, block_hashes, medium, group_idx.
void PackRemoved(Packer& pk, absl::Span<const KvEvent> run, const KvEventWireOptions& options) {
  pk.pack_map(4);
  PackString(pk, "type");
  PackString(pk, "BlockRemoved");
  PackString(pk, "block_hashes");
  PackHashes(pk, run);
  PackString(pk, "medium");
  PackString(pk, Medium(run.front(), options));
  PackString(pk, "group_idx");
  pk.pack_int32(run.front().group.value);
}

absl::Status CheckGroups(absl::Span<const KvEvent> events,
                         absl::Span<const KvEventGroupInfo> groups) {
  for (size_t i = 0; i < events.size(); ++i) {
    const KvEvent& e = events[i];
    if (e.type == KvEvent::Type::kAllCleared) continue;
    if (e.group.value < 0 || e.group.value >= static_cast<int32_t>(groups.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV event ", i, " names group ", e.group.value, ", but ", groups.size(),
                       " groups are described"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t ExternalBlockId(BlockHash hash) { return hash.lo; }

std::string KvCacheSpecKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention: return "full_attention";
    case LayerKind::kSlidingWindow: return "sliding_window";
    case LayerKind::kChunkedLocal: return "chunked_local_attention";
    case LayerKind::kMla: return "mla_attention";
    case LayerKind::kLinearAttention: return "mamba";
  }
  return "full_attention";
}

std::vector<KvEventGroupInfo> KvEventGroupInfos(const KvCacheManager& manager) {
  // Every attention group has the hash block size; a state group's events cover multiples of it.
  int32_t hash_block_size = manager.config().block_size;
  for (int32_t g = 0; g < manager.num_groups(); ++g) {
    if (manager.group_block_size(GroupId(g)) > 0) {
      hash_block_size = manager.group_block_size(GroupId(g));
    }
  }
  std::vector<KvEventGroupInfo> infos;
  for (int32_t g = 0; g < manager.num_groups(); ++g) {
    const LayerKind kind = manager.group_kind(GroupId(g));
    KvEventGroupInfo info{.block_size = manager.group_block_size(GroupId(g)),
                          .kind = KvCacheSpecKindName(kind)};
    if (info.block_size == 0) info.block_size = hash_block_size;
    if (const int32_t window = manager.group_window(GroupId(g)); window > 0) {
      info.sliding_window = window;
    }
    infos.push_back(std::move(info));
  }
  return infos;
}

absl::StatusOr<std::string> EncodeKvEventBatch(double ts, absl::Span<const KvEvent> events,
                                               absl::Span<const KvEventGroupInfo> groups,
                                               const KvEventWireOptions& options) {
  if (absl::Status s = CheckGroups(events, groups); !s.ok()) return s;
  std::vector<absl::Span<const KvEvent>> runs;
  for (size_t i = 0; i < events.size();) {
    size_t end = i + 1;
    while (end < events.size() && JoinsRun(events[end - 1], events[end])) ++end;
    runs.push_back(events.subspan(i, end - i));
    i = end;
  }
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  pk.pack_array(options.data_parallel_rank.has_value() ? 3 : 2);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(runs.size()));
  for (absl::Span<const KvEvent> run : runs) {
    switch (run.front().type) {
      case KvEvent::Type::kStored:
        PackStored(pk, run, groups[run.front().group.value], options);
        break;
      case KvEvent::Type::kRemoved: PackRemoved(pk, run, options); break;
      case KvEvent::Type::kAllCleared:
        pk.pack_map(1);
        PackString(pk, "type");
        PackString(pk, "AllBlocksCleared");
        break;
    }
  }
  if (options.data_parallel_rank.has_value()) pk.pack_int32(*options.data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

}  // namespace kvpage
