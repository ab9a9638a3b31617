"""Scrapes server_loop's metrics endpoint the way Prometheus would and checks the figures
against the loop's own summary.

    python3 server_loop_metrics_test.py build/bin/server_loop
"""
import re
import subprocess
import sys
import urllib.request


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200, reply.status
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return reply.read().decode()


def series(text):
    """{(name, labels-without-model_name): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{model_name="qwen3-8b"(?:,(.*))?\} (\S+)', line)
        assert m, f"malformed sample line: {line!r}"
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def main():
    loop = subprocess.Popen(
        [sys.argv[1], "--requests", "60", "--kv-budget-mib", "1024", "--max-num-seqs", "16",
         "--metrics-port", "0", "--metrics-linger-s", "60"],
        stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in loop.stdout:
            lines.append(line)
            if line.startswith("final metrics served"):
                break
        out = "".join(lines)
        url = re.search(r"serving metrics on (http://\S+)", out).group(1)
        m = series(scrape(url))
        finished = int(re.search(r"qwen3-8b, (\d+) requests", out).group(1))
        steps = int(re.search(r"steps (\d+), tokens (\d+)", out).group(1))
        tokens = int(re.search(r"steps (\d+), tokens (\d+)", out).group(2))
        preemptions = int(re.search(r"preemptions (\d+)", out).group(1))
        hits, prompts = map(int, re.search(
            r"prefix-cache hits (\d+) of (\d+) prompt tokens", out).groups())
        done = (m[("vllm:request_success_total", 'finished_reason="stop"')] +
                m[("vllm:request_success_total", 'finished_reason="length"')])
        checks = {
            "finished": (done, finished),
            "steps": (m[("vllm:iteration_tokens_total_count", "")], steps),
            "tokens": (m[("vllm:iteration_tokens_total_sum", "")], tokens),
            "preemptions": (m[("vllm:num_preemptions_total", "")], preemptions),
            "prompt tokens": (m[("vllm:prompt_tokens_total", "")], prompts),
            "cached tokens": (m[("vllm:prompt_tokens_cached_total", "")], hits),
            "running": (m[("vllm:num_requests_running", "")], 0),
            "kv usage": (m[("vllm:kv_cache_usage_perc", "")], 0),
            "ttft count": (m[("vllm:time_to_first_token_seconds_count", "")], finished),
            "e2e count": (m[("vllm:e2e_request_latency_seconds_count", "")], finished),
            "e2e +Inf": (m[("vllm:e2e_request_latency_seconds_bucket", 'le="+Inf"')], finished),
        }
        bad = {k: v for k, v in checks.items() if v[0] != v[1]}
        assert not bad, f"scraped vs summary: {bad}"
        assert m[("vllm:generation_tokens_total", "")] > finished
        print(f"ok: {finished} requests, {steps} steps, {len(m)} series scraped from {url}")
    finally:
        loop.kill()
        loop.wait()


if __name__ == "__main__":
    main()
