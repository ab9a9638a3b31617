#!/usr/bin/env bash
# Checksums of what kvpage prints, to show a refactoring changed no result: `kvpage sim` on the
# first 2,000 Mooncake requests (qwen3-8b, gemma-3-4b-it, qwen3.5-9b on an H100; the JSON
# without its wall_seconds, requests.csv and steps.csv) and `kvpage plan --format json` for
# every bundled model under the three policies. Run it with two binaries and diff the outputs:
#
#   scripts/output_md5.sh old/bin/kvpage /tmp/old > old.md5
#   scripts/output_md5.sh build/bin/kvpage /tmp/new > new.md5 && diff old.md5 new.md5
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "$1")
OUT=$2
mkdir -p "$OUT"
TRACE=sim/data/traces/mooncake_conversation_trace.jsonl
for m in qwen3-8b gemma-3-4b-it qwen3.5-9b; do
  "$BIN" sim --model "$m" --gpu h100 --trace "$TRACE" --max-requests 2000 --no-progress \
    --output-json "$OUT/sim-$m.json" --output-dir "$OUT/sim-$m" > /dev/null
  python3 - "$OUT/sim-$m.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d.pop("wall_seconds", None)
for v in d.values():
    if isinstance(v, dict):
        v.pop("wall_seconds", None)
json.dump(d, open(sys.argv[1] + ".nowall", "w"), sort_keys=True)
PY
done
for f in sim/data/models/*.json; do
  m=$(basename "$f" .json)
  for p in kvpage vllm llamacpp; do
    "$BIN" plan --model "$m" --policy "$p" --context 4K,32K,128K --gpu h100 --format json \
      > "$OUT/plan-$m-$p.json" 2>&1 || true
  done
done
cd "$OUT" && md5sum sim-*.json.nowall sim-*/requests.csv sim-*/steps.csv plan-*.json
