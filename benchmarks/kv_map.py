"""KV view's block map: redraw time at 10,000 and 100,000 blocks (goal: <= 5 ms at 100,000).

    python benchmarks/kv_map.py [--blocks 10000 100000] [--repeat 50] [--resident 0.8]

For each size, a block index holds ``resident`` x blocks made of shared-prefix chains (stored
over an hour of engine time, a quarter of the chains branching off earlier ones), and the
cache's capacity is ``blocks``. It prints, as medians over ``repeat`` runs:

- ``cells``: the subscriber's side, once per kv event: the resident blocks bucketed by age and
  reuse (``BlockIndex.cells``, under the index's lock);
- ``update``: the view's redraw of the map from a kv event: cell codes, the lookup table, the
  ImageItem's new image (``KvView.draw_map``) — the figure the goal is about;
- ``update+paint``: the same and Qt painting the map's widget into a pixmap (offscreen).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from quantdeck.core.events import KvEvent, from_json
from quantdeck.core.monitor import kv_events as kv
from quantdeck.core.payloads import KvGroupStats

BLOCK = 16
HOUR = 3600.0


def filled_index(resident: int, seed: int = 0) -> kv.BlockIndex:
    """An index holding ``resident`` blocks: chains of 32 blocks, a quarter of them branching
    off an earlier chain after 8-24 blocks, stored over an hour."""
    rng = random.Random(seed)
    idx = kv.BlockIndex()
    counter = iter(range(1 << 62))
    chains: list[list[bytes]] = []
    t0 = 1_000_000.0
    while idx.resident < resident:
        ts = t0 + HOUR * idx.resident / resident
        if chains and rng.random() < 0.25:
            base = rng.choice(chains)
            k = rng.randint(8, min(24, len(base) - 1))
            parent: bytes | None = base[k - 1]
            n = min(16, resident - idx.resident)
        else:
            parent, n = None, min(32, resident - idx.resident)
        hashes = [next(counter).to_bytes(32, "big") for _ in range(n)]
        ev = kv.BlockStored(hashes, parent, list(range(n * BLOCK)), BLOCK, None, "GPU", None)
        idx.apply(kv.KVEventBatch(ts=ts, events=[ev]))
        if parent is None:
            chains.append(hashes)
    return idx


def median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--resident", type=float, default=0.8, help="share of the blocks resident")
    ns = ap.parse_args()

    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    from quantdeck.gui.monitor import KvView

    view = KvView()
    view.resize(1400, 900)
    view.show()
    app.processEvents()
    print(f"{'blocks':>8} {'resident':>8} {'cells ms':>9} {'update ms':>10} {'+paint ms':>10}")
    for blocks in ns.blocks:
        idx = filled_index(int(blocks * ns.resident))
        now = 1_000_000.0 + HOUR + 5
        cells_ms = median_ms(lambda i=idx, t=now: i.cells(0, t), max(5, ns.repeat // 5))
        group = KvGroupStats(0, resident=idx.resident, cells=idx.cells(0, now))
        ev = KvEvent(
            blocks_stored_total=idx.stored,
            blocks_removed_total=0,
            blocks_resident=idx.resident,
            prefix_hit_rate=idx.prefix_hit_rate,
            groups=[group],
            t=now,
        )
        metrics = from_json({"event": "metrics", "t": now, "kv_blocks_total": blocks, "gpus": []})
        view.clear()
        view.add_metrics(metrics)
        view.add_event(ev)
        view.refresh()
        app.processEvents()
        assert len(view.codes) == blocks
        update_ms = median_ms(view.draw_map, ns.repeat)

        def update_and_paint() -> None:
            view.draw_map()
            view.map_widget.grab()

        paint_ms = median_ms(update_and_paint, ns.repeat)
        print(
            f"{blocks:>8,} {idx.resident:>8,} {cells_ms:>9.2f} {update_ms:>10.2f} {paint_ms:>10.2f}"
        )
    view.close()


if __name__ == "__main__":
    main()
