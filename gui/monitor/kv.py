"""The Monitor's KV view: vLLM's prefix cache as its KV events show it (docs/kv.md).

Fed with ``kv`` events (:class:`~quantdeck.core.events.KvEvent`, once a second from the
subscriber of a server started with kv events, or replayed from a recording) and the ``metrics``
events (the capacity, vLLM's own hit rate and block lifetimes). It shows:

- the block map: one cell per block of the cache's capacity (``kv_blocks_total``), resident
  blocks coloured by age or by reuse, free cells blank. vLLM's events carry block hashes, not
  block ids, so the cells are ordered by group, then the oldest first (the event's ``cells``
  runs), not by place in vLLM's block pool. One ImageItem over a lookup table: a redraw is a
  few numpy operations (benchmarks/kv_map.py);
- first, vLLM's own prefix hit rate (its counters, carried by each ``kv`` event), then what
  the block map can see of it (blocks reused: a hit that ends in a partial block stores
  nothing new, so the events never show it);
- resident blocks against the capacity, per group;
- the prefix hit rates (vLLM's and the events') and the stored / removed block rates;
- block lifetimes: evicted lifetime and resident age from the events, vLLM's lifetime
  percentiles when it runs with ``--kv-cache-metrics``;
- the most reused shared prefixes as text, through the model's ``tokenizer.json`` (the
  ``tokenizers`` library, loaded in a worker; token ids are shown without it).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.events import ABSENT, Event, KvEvent, MetricsEvent
from quantdeck.core.monitor.kv_buckets import AGE_EDGES_S, REUSE_EDGES  # no pyzmq here
from quantdeck.core.payloads import KvGroupStats
from quantdeck.gui.labels import plain_label
from quantdeck.gui.style import (
    KV_AGE_COLORMAP,
    KV_FREE_RGB,
    KV_NOT_REUSED_RGB,
    KV_REUSE_COLORMAP,
    PLOT_BACKGROUND,
    SERIES_COLORS,
)
from quantdeck.gui.table_model import Column, ObjectTableModel, row_table

# cell codes: 0 past the capacity (the grid's last row), 1 free, 2 + bucket resident
PAD, FREE, FIRST = 0, 1, 2
AGE_BUCKETS = len(AGE_EDGES_S) + 1
REUSE_BUCKETS = len(REUSE_EDGES) + 1
HISTORY = 3600  # points kept per curve (an hour of kv events)
PREFIX_CHARS = 400  # of a prefix's text shown


def _lut(colors: np.ndarray) -> np.ndarray:
    """The RGBA table for cell codes: padding transparent, free light grey, then ``colors``."""
    lut = np.zeros((FIRST + len(colors), 4), np.uint8)
    lut[FREE] = (*KV_FREE_RGB, 255)
    lut[FIRST:, :3] = colors[:, :3]
    lut[FIRST:, 3] = 255
    return lut


# age: young bright (yellow) to old dark (purple); reuse: none grey-blue, then warmer with more
AGE_LUT = _lut(pg.colormap.get(KV_AGE_COLORMAP).getLookupTable(nPts=AGE_BUCKETS)[::-1])
REUSE_LUT = _lut(
    np.vstack(
        [
            np.array([KV_NOT_REUSED_RGB], np.uint8),
            pg.colormap.get(KV_REUSE_COLORMAP).getLookupTable(0.3, 0.95, nPts=REUSE_BUCKETS - 1)[
                :, :3
            ],
        ]
    )
)


def _age_label(i: int) -> str:
    lo = 0.0 if i == 0 else AGE_EDGES_S[i - 1]
    return f"≥ {lo:g} s" if i == len(AGE_EDGES_S) else f"{lo:g}–{AGE_EDGES_S[i]:g} s"


def _reuse_label(i: int) -> str:
    if i == 0:
        return "not reused"
    lo = REUSE_EDGES[i - 1]
    if i == len(REUSE_EDGES):
        return f"≥ {lo}×"
    hi = REUSE_EDGES[i] - 1
    return f"{lo}×" if lo == hi else f"{lo}–{hi}×"


def map_codes(groups: list[KvGroupStats], capacity: int | None, by: str = "age") -> np.ndarray:
    """One cell code per block: the groups' resident blocks (their ``cells`` runs, group by
    group) coloured by age or reuse bucket, then the free blocks up to ``capacity`` (None: as
    many cells as resident blocks)."""
    col = 0 if by == "age" else 1
    runs = [c for g in groups for c in g.cells or ()]
    if runs:
        arr = np.asarray(runs, np.int64).reshape(-1, 3)
        resident = np.repeat((arr[:, col] + FIRST).astype(np.uint8), arr[:, 2])
    else:
        resident = np.empty(0, np.uint8)
    free = max(0, (capacity or 0) - len(resident))
    return np.concatenate([resident, np.full(free, FREE, np.uint8)])


def grid_shape(n: int, aspect: float = 2.0) -> tuple[int, int]:
    """Rows and columns of a grid of at least ``n`` cells, about ``aspect`` times wider."""
    if n <= 0:
        return 0, 0
    cols = max(1, math.ceil(math.sqrt(n * aspect)))
    return math.ceil(n / cols), cols


def map_image(codes: np.ndarray, by: str = "age") -> np.ndarray:
    """The map's RGBA pixels, one per cell, rows x columns (row-major), padding transparent."""
    rows, cols = grid_shape(len(codes))
    grid = np.zeros(rows * cols, np.uint8)
    grid[: len(codes)] = codes
    return (AGE_LUT if by == "age" else REUSE_LUT)[grid.reshape(rows, cols)]


class _Ring:
    """Preallocated columns of the last ``n`` points (a curve's history)."""

    def __init__(self, names: tuple[str, ...], n: int = HISTORY) -> None:
        self.names = names
        self.data = np.full((len(names) + 1, n), np.nan)  # row 0: t
        self.n = 0
        self.head = 0

    def append(self, t: float, values: dict[str, float | None]) -> None:
        col = self.head
        self.data[0, col] = t
        for i, name in enumerate(self.names, 1):
            v = values.get(name)
            self.data[i, col] = np.nan if v is None else v
        self.head = (col + 1) % self.data.shape[1]
        self.n = min(self.n + 1, self.data.shape[1])

    def clear(self) -> None:
        self.data[:] = np.nan
        self.n = self.head = 0

    def series(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(t, values) of ``name``, oldest first."""
        size = self.data.shape[1]
        idx = (np.arange(self.n) + (self.head - self.n)) % size
        return self.data[0, idx], self.data[self.names.index(name) + 1, idx]


@dataclass(frozen=True)
class GroupRow:
    """One KV-cache group of the latest ``kv`` event, against the cache's capacity."""

    group: int
    kind: str
    block_size: int | None
    resident: int
    capacity: int | None
    stored: int
    reused: int
    evicted: int
    hit_rate: float | None

    @property
    def share_pct(self) -> float | None:
        return 100.0 * self.resident / self.capacity if self.capacity else None


def _opt(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _present(v: Any) -> Any:
    """A field's value, None where the event does not carry it (:data:`ABSENT`)."""
    return None if v is ABSENT else v


def hit_rates_text(ev: KvEvent) -> str:
    """vLLM's prefix hit rate first (its counters, tokens), then what the block map sees of
    it (blocks reused, from the events), and why the two differ."""
    hits, queries = ev.vllm_prefix_hit_tokens_total, ev.vllm_prefix_query_tokens_total
    rate = _present(ev.vllm_prefix_hit_rate)
    if isinstance(hits, int) and isinstance(queries, int):
        if rate is None:
            lead = "vLLM: no prompt tokens yet"
        else:
            lead = (
                f"vLLM: {100 * rate:.0f} % of prompt tokens hit the prefix cache"
                f" ({hits:,} of {queries:,} since the server started)"
            )
    else:
        lead = "vLLM's prefix-cache counters: not in these events"
    blocks = "block" if ev.blocks_reused_total == 1 else "blocks"
    seen = (
        ""
        if ev.prefix_hit_rate is None
        else f", {100 * ev.prefix_hit_rate:.0f} % of the blocks it saw"
    )
    reused = f"block map: {ev.blocks_reused_total:,} {blocks} reused{seen}"
    return f"{lead} · {reused} ({BLOCK_MAP_NOTE})"


GROUP_COLUMNS: tuple[Column[GroupRow], ...] = (
    Column("group", lambda r: str(r.group)),
    Column("kind", lambda r: r.kind),
    Column("block", lambda r: _opt(r.block_size, "d"), align_right=True),
    Column("resident", lambda r: f"{r.resident:,}", align_right=True),
    Column("capacity", lambda r: _opt(r.capacity, ",d"), align_right=True),
    Column(
        "of capacity",
        lambda r: _opt(r.share_pct, ".1f") + " %",
        value=lambda r: r.share_pct or 0.0,
    ),
    Column("stored", lambda r: f"{r.stored:,}", align_right=True),
    Column("reused", lambda r: f"{r.reused:,}", align_right=True),
    Column("evicted", lambda r: f"{r.evicted:,}", align_right=True),
    Column(
        "prefix hits",
        lambda r: _opt(None if r.hit_rate is None else 100 * r.hit_rate, ".1f") + " %",
    ),
)


@dataclass(frozen=True)
class PrefixRow:
    """A shared prefix of the latest ``kv`` event and its text (or token ids)."""

    id: str
    group: int
    blocks: int
    hits: int
    text: str


PREFIX_COLUMNS: tuple[Column[PrefixRow], ...] = (
    Column("hits", lambda r: str(r.hits), align_right=True),
    Column("blocks", lambda r: str(r.blocks), align_right=True),
    Column("group", lambda r: str(r.group), align_right=True),
    Column("prefix", lambda r: r.text, tooltip=lambda r: r.text),
)


def _load_tokenizer(path: str) -> Any:
    """``tokenizers.Tokenizer`` from a model folder's ``tokenizer.json`` (in a worker)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


KV_SERIES = (
    "hit_pct",
    "vllm_total_hit_pct",
    "stored_per_s",
    "removed_per_s",
    "evicted_life_s",
    "age_mean_s",
)
# what the block map cannot see of vLLM's hits (docs/kv.md, "Two hit rates")
BLOCK_MAP_NOTE = "hits ending in a partial block store nothing new, so the map cannot see them"
METRIC_SERIES = ("vllm_hit_pct", "life_p50_s", "life_p99_s", "idle_p50_s")


class KvView(QWidget):
    """Block map, groups, hit and eviction curves, shared prefixes and block lifetimes."""

    def __init__(self, parent: QWidget | None = None, *, fps: float = 2.0) -> None:
        super().__init__(parent)
        self.last: KvEvent | None = None  # the latest kv event
        self.capacity: int | None = None  # kv_blocks_total of the latest metrics event
        self.lifetimes: dict[str, float | None] = {}  # vLLM's, from the latest metrics event
        self.kv_cache_metrics = False  # the server runs with --kv-cache-metrics (its launch's)
        self.color_by = "age"
        self.prefix_tokens: dict[str, list[int]] = {}
        self.tokenizer: Any = None
        self.tokenizer_path: str | None = None
        self.kv_ring = _Ring(KV_SERIES)
        self.metric_ring = _Ring(METRIC_SERIES)
        self.codes = np.empty(0, np.uint8)
        self._shape = (0, 0)  # the map's grid, rows x columns
        self._dirty = False
        self._workers: Any = None

        self.summary = plain_label("No KV events: start a server with “KV events” ticked")
        self.summary.setWordWrap(True)
        self.color_box = QComboBox()
        self.color_box.addItems(["age", "reuse"])
        self.color_box.setToolTip("Colour resident blocks by their age or by how often reused")
        self.color_box.currentTextChanged.connect(self._on_color_changed)
        bar = QHBoxLayout()
        bar.addWidget(self.summary, 1)
        bar.addWidget(QLabel("colour by"))
        bar.addWidget(self.color_box)

        self.map_widget = pg.GraphicsLayoutWidget()
        self.map_widget.setBackground(PLOT_BACKGROUND)
        self.map_box = self.map_widget.addViewBox(lockAspect=True, invertY=True, enableMouse=True)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.map_box.addItem(self.image)
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)

        self.groups_model: ObjectTableModel[GroupRow] = ObjectTableModel(GROUP_COLUMNS, self)
        self.groups_table = row_table(self.groups_model, progress_column="of capacity")
        self.prefix_model: ObjectTableModel[PrefixRow] = ObjectTableModel(PREFIX_COLUMNS, self)
        self.prefix_table = row_table(self.prefix_model)
        self.lifetime_label = plain_label("")
        self.lifetime_label.setWordWrap(True)

        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground(PLOT_BACKGROUND)
        self.curves: dict[str, pg.PlotDataItem] = {}
        keys: list[str] = []
        for title, series in (
            (
                "Prefix hits (%)",
                [
                    ("vllm_total_hit_pct", "vLLM, since start", 0),
                    ("vllm_hit_pct", "vLLM, last minute", 3),
                    ("hit_pct", "block map", 4),
                ],
            ),
            ("Blocks / s", [("stored_per_s", "stored", 0), ("removed_per_s", "removed", 2)]),
            (
                "Block lifetime (s)",
                [
                    ("evicted_life_s", "evicted, mean", 2),
                    ("age_mean_s", "resident age, mean", 4),
                    ("life_p50_s", "vLLM p50", 0),
                    ("life_p99_s", "vLLM p99", 1),
                ],
            ),
        ):
            plot = self.plots.addPlot(title=title)
            plot.showGrid(x=True, y=True, alpha=0.2)
            plot.setLabel("bottom", "s")
            # no negative counts, rates or ages; a percentage on 0-100 (an idle plot read
            # -30..30 % on pyqtgraph's own empty range)
            if title.endswith("(%)"):
                plot.setYRange(0, 100, padding=0)
                plot.enableAutoRange(axis="y", enable=False)
            plot.setLimits(yMin=0)
            for name, label, color in series:
                self.curves[name] = plot.plot(
                    pen=pg.mkPen(SERIES_COLORS[color], width=1), name=label
                )
            keys.append(
                f"<b>{html.escape(title)}</b>: "
                + " ".join(
                    f"<span style='color:{SERIES_COLORS[color]}'>━</span>&nbsp;{html.escape(label)}"
                    for _, label, color in series
                )
            )
            self.plots.nextRow()
        # the curves' keys above the plots, wrapped (a legend inside a plot hid its data and
        # lost an entry at 1400x900)
        self.plot_keys = QLabel(" &nbsp;·&nbsp; ".join(keys))
        self.plot_keys.setTextFormat(Qt.TextFormat.RichText)
        self.plot_keys.setWordWrap(True)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.map_widget, 3)
        ll.addWidget(self.legend)
        ll.addWidget(self.groups_table, 1)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.plot_keys)
        rl.addWidget(self.plots, 3)
        rl.addWidget(self.lifetime_label)
        rl.addWidget(QLabel("<b>Shared prefixes</b> (most reused first)"))
        rl.addWidget(self.prefix_table, 1)
        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([600, 500])
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(split, 1)
        self._update_legend()

        self.timer = QTimer(self)
        self.timer.setInterval(int(1000 / fps))
        self.timer.timeout.connect(self._on_tick)
        self.timer.start()

    # -- input -------------------------------------------------------------------------------
    def add_event(self, ev: Event) -> None:
        """Take a ``kv`` event (others are ignored); drawn at the next tick."""
        if not isinstance(ev, KvEvent):
            return
        self.last = ev
        self.prefix_tokens.update(ev.prefix_tokens)
        self.kv_ring.append(
            ev.t,
            {
                "hit_pct": _pct(ev.prefix_hit_rate),
                "vllm_total_hit_pct": _pct(_present(ev.vllm_prefix_hit_rate)),
                "stored_per_s": ev.stored_per_s,
                "removed_per_s": ev.removed_per_s,
                "evicted_life_s": ev.evicted_lifetime_mean_s,
                "age_mean_s": ev.resident_age_mean_s,
            },
        )
        self._dirty = True

    def add_metrics(self, ev: Event) -> None:
        """Take a ``metrics`` event: the capacity, vLLM's hit rate and block lifetimes."""
        if not isinstance(ev, MetricsEvent):
            return
        m = ev.metrics  # the scrape's figures (None: the server did not answer)
        if m is None:
            return
        if isinstance(m.kv_blocks_total, int) and m.kv_blocks_total > 0:
            self.capacity = m.kv_blocks_total

        def sec(ms: float | None) -> float | None:
            return None if ms is None else ms / 1000.0

        self.lifetimes = {
            "lifetime_p50": sec(m.kv_block_lifetime_p50_ms),
            "lifetime_p90": sec(m.kv_block_lifetime_p90_ms),
            "lifetime_p99": sec(m.kv_block_lifetime_p99_ms),
            "idle_p50": sec(m.kv_block_idle_p50_ms),
            "idle_p99": sec(m.kv_block_idle_p99_ms),
            "reuse_gap_p50": sec(m.kv_block_reuse_gap_p50_ms),
            "reuse_gap_p99": sec(m.kv_block_reuse_gap_p99_ms),
        }
        self.metric_ring.append(
            ev.t,
            {
                "vllm_hit_pct": _pct(m.prefix_cache_hit_rate),
                "life_p50_s": self.lifetimes["lifetime_p50"],
                "life_p99_s": self.lifetimes["lifetime_p99"],
                "idle_p50_s": self.lifetimes["idle_p50"],
            },
        )
        self._dirty = True

    def clear(self) -> None:
        """Forget everything shown (a new server, a replay)."""
        self.kv_cache_metrics = False  # the server runs with --kv-cache-metrics (its launch's)
        self.last = None
        self.capacity = None
        self.lifetimes = {}
        self.prefix_tokens.clear()
        self.kv_ring.clear()
        self.metric_ring.clear()
        self._dirty = True

    def set_model(self, model: str | None) -> None:
        """The model whose ``tokenizer.json`` turns prefixes into text (loaded in a worker);
        None or a folder without one: token ids are shown."""
        path = str(Path(model) / "tokenizer.json") if model else None
        if path == self.tokenizer_path:
            return
        self.tokenizer_path, self.tokenizer = path, None
        self._dirty = True
        if path is None or not Path(path).is_file():
            return
        if self._workers is None:
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(self._on_tokenizer_error)
        self._workers.start(
            _load_tokenizer, path, returned=lambda tok, p=path: self._on_tokenizer(p, tok)
        )

    def _on_tokenizer(self, path: str, tok: Any) -> None:
        if path == self.tokenizer_path:
            self.tokenizer = tok
            self._dirty = True
            self.refresh()

    def _on_tokenizer_error(self, msg: str) -> None:
        self.lifetime_label.setText(f"tokenizer: {msg}; prefixes shown as token ids")

    def shutdown(self) -> None:
        """Stop the timer; wait for a tokenizer still loading."""
        self.timer.stop()
        if self._workers is not None:
            self._workers.wait(10.0)

    # -- drawing -----------------------------------------------------------------------------
    def _on_tick(self) -> None:
        if self._dirty and self.isVisible():
            self.refresh()

    def _on_color_changed(self, by: str) -> None:
        self.color_by = by
        self._update_legend()
        self.draw_map()

    def refresh(self) -> None:
        """Draw everything from the latest events."""
        self._dirty = False
        self.draw_map()
        self._update_groups()
        self._update_curves()
        self._update_prefixes()
        self._update_figures()

    def draw_map(self) -> None:
        """The block map from the latest kv event and capacity."""
        groups = self.last.groups if self.last is not None else []
        self.codes = map_codes(groups, self.capacity, self.color_by)
        if not len(self.codes):
            self.image.clear()
            return
        self.image.setImage(map_image(self.codes, self.color_by), autoLevels=False)
        shape = grid_shape(len(self.codes))
        if shape != self._shape:  # a new grid: show it whole (else the user's zoom stays)
            self._shape = shape
            self.map_box.setRange(xRange=(0, shape[1]), yRange=(0, shape[0]), padding=0.02)

    def _update_legend(self) -> None:
        if self.color_by == "age":
            lut, labels = AGE_LUT, [_age_label(i) for i in range(AGE_BUCKETS)]
        else:
            lut, labels = REUSE_LUT, [_reuse_label(i) for i in range(REUSE_BUCKETS)]
        items = [(lut[FREE], "free")] + [(lut[FIRST + i], s) for i, s in enumerate(labels)]
        self.legend.setText(
            "&nbsp; ".join(
                f"<span style='color:#{r:02x}{g:02x}{b:02x}'>■</span>&nbsp;{s}"
                for (r, g, b, _), s in items
            )
        )

    def _update_groups(self) -> None:
        groups = self.last.groups if self.last is not None else []
        self.groups_model.set_rows(
            GroupRow(
                group=g.group,
                kind=g.kind or "full attention",
                block_size=g.block_size,
                resident=g.resident,
                capacity=self.capacity,
                stored=g.stored,
                reused=g.reused,
                evicted=g.evicted,
                hit_rate=g.prefix_hit_rate,
            )
            for g in groups
        )

    def _update_curves(self) -> None:
        last_t = [r.series(r.names[0])[0] for r in (self.kv_ring, self.metric_ring) if r.n]
        now = max(float(t[-1]) for t in last_t) if last_t else 0.0
        for ring in (self.kv_ring, self.metric_ring):
            for name in ring.names:
                if name in self.curves:
                    t, y = ring.series(name)
                    self.curves[name].setData(t - now, y, connect="finite")

    def prefix_text(self, pid: str) -> str:
        """A shared prefix as text (through the tokenizer) or as its token ids."""
        ids = self.prefix_tokens.get(pid)
        if ids is None:
            return "(tokens not received)"
        if self.tokenizer is not None:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            text = text.replace("\n", "⏎ ")
        else:
            text = "ids " + " ".join(map(str, ids))
        return text if len(text) <= PREFIX_CHARS else text[:PREFIX_CHARS] + "…"

    def _update_prefixes(self) -> None:
        top = self.last.top_prefixes if self.last is not None else []
        self.prefix_model.set_rows(
            PrefixRow(p.id, p.group, p.blocks, p.hits, self.prefix_text(p.id)) for p in top
        )

    def _update_figures(self) -> None:
        ev = self.last
        if ev is None:
            self.summary.setText("No KV events: start a server with “KV events” ticked")
        else:
            cap = f" of {self.capacity:,}" if self.capacity else ""
            lost = ev.batches_lost
            self.summary.setText(
                hit_rates_text(ev) + f"\nresident {ev.blocks_resident:,} blocks{cap}"
                f" · stored {ev.blocks_stored_total:,} · removed {ev.blocks_removed_total:,}"
                f" · evicted {ev.evicted_total:,}"
                + (f" · {lost} batches lost: the index may be off" if lost else "")
            )
        parts = []
        if ev is not None:
            parts.append(
                f"evicted lifetime mean {_opt(ev.evicted_lifetime_mean_s, '.1f')} s · "
                f"resident age mean {_opt(ev.resident_age_mean_s, '.1f')} s, "
                f"max {_opt(ev.resident_age_max_s, '.1f')} s"
            )
        lt = self.lifetimes
        if any(v is not None for v in lt.values()):
            parts.append(
                "vLLM: lifetime p50/p90/p99 "
                f"{_opt(lt.get('lifetime_p50'), '.1f')}/{_opt(lt.get('lifetime_p90'), '.1f')}/"
                f"{_opt(lt.get('lifetime_p99'), '.1f')} s · idle before eviction p50 "
                f"{_opt(lt.get('idle_p50'), '.1f')} s · reuse gap p50 "
                f"{_opt(lt.get('reuse_gap_p50'), '.1f')} s"
            )
        elif self.capacity is not None and self.kv_cache_metrics:
            parts.append(
                "vLLM's block lifetimes: none sampled yet (--kv-cache-metrics is on: they come "
                "as sampled blocks are evicted or reused)"
            )
        elif self.capacity is not None:
            parts.append("vLLM's block lifetimes: none (vLLM reports them with --kv-cache-metrics)")
        if parts:
            self.lifetime_label.setText("\n".join(parts))
