// Decoding a KVEventBatch payload (vLLM's or kvpage's) with msgpack-c. msgpack-c reports bad
// input by throwing; the throw stays inside DecodeKvEventBatch and becomes InvalidArgument.
#include <msgpack.hpp>

#include <cstdint>
#include <exception>
#include <limits>
#include <string_view>

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "kvpage/kv_event_wire.h"

namespace kvpage {
namespace {

using msgpack::object;
namespace mtype = msgpack::type;

absl::Status Bad(absl::string_view what, absl::string_view field) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// Block hashes: msgpack ints, either sign (some producers send signed 64-bit ids).
absl::StatusOr<uint64_t> ReadHash(const object& o, absl::string_view field) {
  if (o.type == mtype::POSITIVE_INTEGER) return o.via.u64;
  if (o.type == mtype::NEGATIVE_INTEGER) return static_cast<uint64_t>(o.via.i64);
  return Bad("is not an integer", field);
}

absl::StatusOr<int64_t> ReadInt(const object& o, absl::string_view field, int64_t lo,
                                int64_t hi) {
  int64_t v = 0;
  if (o.type == mtype::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<uint64_t>(hi)) return Bad("is out of range", field);
    v = static_cast<int64_t>(o.via.u64);
  } else if (o.type == mtype::NEGATIVE_INTEGER) {
    v = o.via.i64;
  } else {
    return Bad("is not an integer", field);
  }
  if (v < lo || v > hi) return Bad(absl::StrCat("is out of range (", v, ")"), field);
  return v;
}

absl::StatusOr<int32_t> ReadInt32(const object& o, absl::string_view field) {
  absl::StatusOr<int64_t> v = ReadInt(o, field, std::numeric_limits<int32_t>::min(),
                                      std::numeric_limits<int32_t>::max());
  if (!v.ok()) return v.status();
  return static_cast<int32_t>(*v);
}

absl::StatusOr<std::string> ReadString(const object& o, absl::string_view field) {
  if (o.type != mtype::STR) return Bad("is not a string", field);
  return std::string(o.via.str.ptr, o.via.str.size);
}

// Reads a field that may be nil into `out` (left unset for nil).
template <typename T, typename Reader>
absl::Status ReadOptional(const object& o, absl::string_view field, Reader read,
                          std::optional<T>& out) {
  if (o.type == mtype::NIL) return absl::OkStatus();
  auto v = read(o, field);
  if (!v.ok()) return v.status();
  out = static_cast<T>(*v);
  return absl::OkStatus();
}

absl::Status ReadHashes(const object& o, std::vector<uint64_t>& out) {
  if (o.type != mtype::ARRAY) return Bad("is not an array", "block_hashes");
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    absl::StatusOr<uint64_t> h = ReadHash(o.via.array.ptr[i], "block_hashes element");
    if (!h.ok()) return h.status();
    out.push_back(*h);
  }
  return absl::OkStatus();
}

absl::Status ReadTokens(const object& o, std::vector<int64_t>& out) {
  if (o.type != mtype::ARRAY) return Bad("is not an array", "token_ids");
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    absl::StatusOr<int64_t> t = ReadInt(o.via.array.ptr[i], "token_ids element",
                                        std::numeric_limits<int64_t>::min(),
                                        std::numeric_limits<int64_t>::max());
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  return absl::OkStatus();
}

// One known field of an event map; unknown keys are skipped.
absl::Status ReadField(absl::string_view key, const object& v, WireKvEvent& e, bool& has_hashes) {
  auto read_hash = [](const object& o, absl::string_view f) { return ReadHash(o, f); };
  auto read_i64 = [](const object& o, absl::string_view f) {
    return ReadInt(o, f, std::numeric_limits<int64_t>::min(),
                   std::numeric_limits<int64_t>::max());
  };
  auto read_i32 = [](const object& o, absl::string_view f) { return ReadInt32(o, f); };
  auto read_str = [](const object& o, absl::string_view f) { return ReadString(o, f); };
  if (key == "block_hashes") {
    has_hashes = true;
    return ReadHashes(v, e.block_hashes);
  }
  if (key == "parent_block_hash") return ReadOptional(v, key, read_hash, e.parent_block_hash);
  if (key == "token_ids") return ReadTokens(v, e.token_ids);
  if (key == "block_size") {
    absl::StatusOr<int32_t> bs = ReadInt32(v, key);
    if (!bs.ok()) return bs.status();
    e.block_size = *bs;
    return absl::OkStatus();
  }
  if (key == "lora_id") return ReadOptional(v, key, read_i64, e.lora_id);
  if (key == "medium") return ReadOptional(v, key, read_str, e.medium);
  if (key == "lora_name") return ReadOptional(v, key, read_str, e.lora_name);
  if (key == "group_idx") return ReadOptional(v, key, read_i32, e.group_idx);
  if (key == "kv_cache_spec_kind") return ReadOptional(v, key, read_str, e.kv_cache_spec_kind);
  if (key == "kv_cache_spec_sliding_window") {
    return ReadOptional(v, key, read_i32, e.kv_cache_spec_sliding_window);
  }
  return absl::OkStatus();
}

absl::StatusOr<WireKvEvent::Type> ReadType(const object& v) {
  absl::StatusOr<std::string> name = ReadString(v, "type");
  if (!name.ok()) return name.status();
  if (*name == "BlockStored") return WireKvEvent::Type::kBlockStored;
  if (*name == "BlockRemoved") return WireKvEvent::Type::kBlockRemoved;
  if (*name == "AllBlocksCleared") return WireKvEvent::Type::kAllBlocksCleared;
  return Bad(absl::StrCat("'", *name, "' is not an event type"), "type");
}

absl::StatusOr<WireKvEvent> ReadEvent(const object& o, size_t index) {
  const std::string where = absl::StrCat("event ", index);
  if (o.type != mtype::MAP) return Bad("is not a map", where);
  WireKvEvent e;
  bool has_type = false;
  bool has_hashes = false;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    if (kv.key.type != mtype::STR) return Bad("has a key that is not a string", where);
    const absl::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
    absl::Status s;
    if (key == "type") {
      absl::StatusOr<WireKvEvent::Type> t = ReadType(kv.val);
      s = t.status();
      if (t.ok()) e.type = *t;
      has_type = true;
    } else {
      s = ReadField(key, kv.val, e, has_hashes);
    }
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  if (!has_type) return Bad("has no \"type\"", where);
  if (e.type != WireKvEvent::Type::kAllBlocksCleared && !has_hashes) {
    return Bad("has no block_hashes", where);
  }
  return e;
}

absl::StatusOr<WireKvEventBatch> ReadBatch(const object& root) {
  if (root.type != mtype::ARRAY || root.via.array.size < 2 || root.via.array.size > 3) {
    return Bad("is not an array [ts, events, data_parallel_rank]", "payload");
  }
  const object* items = root.via.array.ptr;
  WireKvEventBatch batch;
  if (items[0].type == mtype::FLOAT64 || items[0].type == mtype::FLOAT32) {
    batch.ts = items[0].via.f64;
  } else if (items[0].type == mtype::POSITIVE_INTEGER) {
    batch.ts = static_cast<double>(items[0].via.u64);
  } else {
    return Bad("is not a number", "ts");
  }
  if (items[1].type != mtype::ARRAY) return Bad("is not an array", "events");
  for (uint32_t i = 0; i < items[1].via.array.size; ++i) {
    absl::StatusOr<WireKvEvent> e = ReadEvent(items[1].via.array.ptr[i], i);
    if (!e.ok()) return e.status();
    batch.events.push_back(*std::move(e));
  }
  if (root.via.array.size == 3) {
    auto read_i32 = [](const object& o, absl::string_view f) { return ReadInt32(o, f); };
    absl::Status s = ReadOptional(items[2], "data_parallel_rank", read_i32,
                                  batch.data_parallel_rank);
    if (!s.ok()) return s;
  }
  return batch;
}

}  // namespace

absl::StatusOr<WireKvEventBatch> DecodeKvEventBatch(std::string_view payload) {
  // Every element takes at least one byte: no count may exceed the payload's size.
  const std::size_t n = payload.size();
  const msgpack::unpack_limit limit(n, n, n, n, n, /*depth=*/16);
  std::size_t offset = 0;
  msgpack::object_handle handle;
  try {
    handle = msgpack::unpack(payload.data(), payload.size(), offset, nullptr, nullptr, limit);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV event batch: not a msgpack value (", payload.size(), " bytes): ", e.what()));
  }
  if (offset != payload.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV event batch: ", payload.size() - offset,
                                                   " trailing bytes at offset ", offset));
  }
  absl::StatusOr<WireKvEventBatch> batch = ReadBatch(handle.get());
  if (!batch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KV event batch: ", batch.status().message()));
  }
  return batch;
}

}  // namespace kvpage
