#!/usr/bin/env bash
# Differential check of kvpage's vllm accounting against vLLM's own KVCacheManager (CPU).
# See README.md. Usage: tools/vllm_diff/run.sh [workload ...]   (default: all)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${VLLM_DIFF_VENV:-$root/../vllm-venv}"
vllm_version="${VLLM_DIFF_VERSION:-0.33}"
# The release kvpage emulates; set it apart from vLLM's to see the harness catch a difference.
kvpage_version="${VLLM_DIFF_KVPAGE_VERSION:-$vllm_version}"
build="${VLLM_DIFF_BUILD:-$root/build-fast}"
work="${VLLM_DIFF_WORK:-$build/vllm_diff}"
trace="$root/sim/data/traces/mooncake_conversation_trace.jsonl"

if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install "vllm==${vllm_version}.*"
fi
"$venv/bin/python" -c "import vllm; print('vLLM', vllm.__version__)"
cmake --build "$build" --target kvpage_vllm_replay -j 2 >/dev/null
driver="$build/bin/kvpage_vllm_replay"
mkdir -p "$work"

# name model num_gpu_blocks [extra vllm_replay.py flags]
workloads=(
  "llama llama-3.1-8b 3000"
  "gemma gemma-3-4b-it 1600"
  "gemma_prefix gemma-3-4b-it 20000 --shared-prefix-tokens 4096 --max-live 4"
  "deepseek deepseek-v2-lite 3000"
  "qwen35 qwen3.5-0.8b 60"
  "qwen35_prefix qwen3.5-0.8b 400 --shared-prefix-tokens 4096"
  "nemotron nemotron-3-nano-30b-a3b 200"
  "nemotron_prefix nemotron-3-nano-30b-a3b 400 --shared-prefix-tokens 4096"
  "llama4 llama-4-scout-17b-16e-instruct 3000"
  "deepseek32 deepseek-v3.2 800"
  "jamba jamba-1.5-mini 1500"
  "kimi kimi-linear-48b-a3b-instruct 200"
  "kimi_prefix kimi-linear-48b-a3b-instruct 400 --shared-prefix-tokens 4096"
)
selected=("$@")
status=0
for w in "${workloads[@]}"; do
  read -r name model blocks extra <<<"$w"
  if [[ ${#selected[@]} -gt 0 && ! " ${selected[*]} " =~ " $name " ]]; then continue; fi
  "$driver" layout --model "$model" --vllm-version "$kvpage_version" --max-model-len 32768 \
    >"$work/$name.layout.json"
  stats=$(VLLM_LOGGING_LEVEL=ERROR "$venv/bin/python" "$here/vllm_replay.py" \
    --layout "$work/$name.layout.json" --trace "$trace" --num-requests 300 \
    --num-blocks "$blocks" --vllm-version "$kvpage_version" \
    --out "$work/$name.ops.jsonl" ${extra:-})
  echo "== $name ($model, num_gpu_blocks $blocks): vLLM $stats"
  "$driver" replay --log "$work/$name.ops.jsonl" || status=1
done
# The schedulers: name model num_gpu_blocks max_num_batched_tokens [num_gpu_blocks_async]. Each
# runs twice: as named (synchronous scheduling) and as NAME_async (vLLM's AsyncScheduler against
# kvpage's async_scheduling). Async scheduling doubles a sliding window's admission bound (two
# batches in flight): gemma's 8,192-token budget then needs 8,582 blocks for one 32,768-token
# request, and vLLM would refuse 8,000 at startup (with them it never admits r7 and loops).
sched_workloads=(
  "sched_llama_2048 llama-3.1-8b 3000 2048"
  "sched_llama_8192 llama-3.1-8b 3000 8192"
  "sched_gemma_2048 gemma-3-4b-it 4000 2048"
  "sched_gemma_8192 gemma-3-4b-it 8000 8192 9000"
  "sched_qwen35_2048 qwen3.5-0.8b 100 2048"
  "sched_qwen35_8192 qwen3.5-0.8b 100 8192"
  "sched_nemotron_2048 nemotron-3-nano-30b-a3b 60 2048"
  "sched_llama4_2048 llama-4-scout-17b-16e-instruct 3000 2048"
  "sched_kimi_2048 kimi-linear-48b-a3b-instruct 60 2048"
  "sched_jamba_2048 jamba-1.5-mini 1500 2048"
)
for w in "${sched_workloads[@]}"; do
  read -r base model sync_blocks budget async_blocks <<<"$w"
  for mode in sync async; do
    name=$base async_flag="" blocks=$sync_blocks
    if [[ $mode == async ]]; then
      name="${base}_async" async_flag="--async" blocks=${async_blocks:-$sync_blocks}
    fi
    if [[ ${#selected[@]} -gt 0 && ! " ${selected[*]} " =~ " $name " ]]; then continue; fi
    "$driver" layout --model "$model" --vllm-version "$kvpage_version" --max-model-len 32768 \
      >"$work/$name.layout.json"
    stats=$(cd "$here" && HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR "$venv/bin/python" \
      vllm_sched_replay.py --layout "$work/$name.layout.json" \
      --model-config "$root/sim/data/models/llama-3.1-8b.json" --trace "$trace" --num-requests 300 \
      --num-blocks "$blocks" --max-num-batched-tokens "$budget" \
      --vllm-version "$kvpage_version" --free-order-steps "${VLLM_DIFF_FREE_ORDER_STEPS:-}" \
      --out "$work/$name.ops.jsonl" $async_flag 2>/dev/null)
    echo "== $name ($model, num_gpu_blocks $blocks, max_num_batched_tokens $budget): vLLM $stats"
    "$driver" sched --log "$work/$name.ops.jsonl" || status=1
  done
done
exit $status
