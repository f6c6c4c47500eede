"""The fleet file: what it reads, and every bad file refused in one line before anything starts
(``fleet check`` and ``fleet up`` exit 2 and spawn nothing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt import LLAMA3_8B, TINY_LLAMA, write_checkpoint
from fuzz import JSON_VALUES, fuzz_settings, mutated, one_line_error
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.cli.main import main
from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.events import FactEvent, InstanceEvent, StateEvent, from_json
from quantdeck.core.fleet import FallbackRule, check_fleet, load_fleet, router_command
from quantdeck.core.launch import cuda_device


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model", TINY_LLAMA)


def write_fleet(tmp_path: Path, doc: Any, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def two(model: Path, **extra: Any) -> dict[str, Any]:
    """A good two-instance fleet on the CPU."""
    inst = {"profile": {"model": str(model), "max-num-seqs": 2}}
    return {
        "router": {"port": 18080, "policy": "round_robin", "retries": 3},
        "instances": [
            {"name": "a", "port": 18001, **inst},
            {"name": "b", "port": 18002, "role": "backup", "cpus": [0, 1], **inst},
        ],
        **extra,
    }


def test_a_good_file_reads_and_routes_the_primaries(tmp_path: Path, model: Path) -> None:
    spec = load_fleet(write_fleet(tmp_path, two(model)))
    check_fleet(spec)
    a, b = spec.instances
    assert (a.url, b.url, b.role) == ("http://127.0.0.1:18001", "http://127.0.0.1:18002", "backup")
    assert b.env() == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}
    cmd = router_command(spec)
    assert cmd[cmd.index("--worker-urls") + 1 :] == [a.url, "--retry-max-retries=3"]
    assert "--port=18080" in cmd and "--policy=round_robin" in cmd


def test_profile_file_is_read_relative_to_the_fleet_file(tmp_path: Path, model: Path) -> None:
    (tmp_path / "p.yaml").write_text(f"model: {model}\nport: 9100\nmax-num-seqs: 3\n")
    spec = load_fleet(write_fleet(tmp_path, {"instances": [{"name": "a", "profile": "p.yaml"}]}))
    cfg = spec.instances[0].cfg
    assert cfg is not None and (cfg.server.port, cfg.scheduler.max_num_seqs) == (9100, 3)


def test_gpus_become_cuda_visible_devices(tmp_path: Path, model: Path) -> None:
    doc = two(model)
    doc["instances"][1].pop("cpus")
    for inst in doc["instances"]:
        inst["gpus"] = [1]
        inst["profile"] = {**inst["profile"], "gpu-memory-utilization": 0.45}
    spec = load_fleet(write_fleet(tmp_path, doc))
    check_fleet(spec, device=cuda_device(80, count=2))
    assert spec.instances[0].env() == {"CUDA_VISIBLE_DEVICES": "1"}


def test_the_api_key_comes_from_the_environment_only(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_KEY", "sk-secret-1")
    doc = two(model)
    doc["router"]["api_key"] = "env:FLEET_KEY"
    spec = load_fleet(write_fleet(tmp_path, doc))
    assert spec.router.api_key == "sk-secret-1"
    assert "sk-secret-1" not in " ".join(router_command(spec)) + repr(spec)
    doc["router"]["api_key"] = "sk-secret-2"
    with pytest.raises(ConfigError, match="env:VARIABLE or keyring:PROFILE") as e:
        load_fleet(write_fleet(tmp_path, doc))
    assert "sk-secret-2" not in str(e.value)


def _bad(model: Path, tmp_path: Path) -> dict[str, tuple[Any, str]]:
    """Bad fleet files and the words their one error line must hold."""
    good = two(model)
    same_port = two(model)
    same_port["instances"][1]["port"] = 18001
    router_port = two(model)
    router_port["router"]["port"] = 18002
    dup = two(model)
    dup["instances"][1]["name"] = "a"
    unknown = two(model)
    unknown["instances"][0]["gpu"] = [0]
    missing = two(model)
    missing["instances"][0]["profile"] = "nowhere.yaml"
    advisor = two(model)
    advisor["instances"][0]["profile"] = {"model": str(model), "max-model-len": 10**6}
    remote = two(model)
    remote["instances"].append({"name": "far", "url": "http://127.0.0.1:9"})
    return {
        "unknown top key": ({**good, "routers": {}}, "unknown key 'routers'"),
        "unknown instance key": (unknown, "unknown key 'gpu'"),
        "unknown router key": ({**good, "router": {"prot": 1}}, "unknown key 'prot'"),
        "two on one port": (same_port, "both use port 18001"),
        "instance on the router's port": (router_port, "the router both use port 18002"),
        "duplicate names": (dup, "two instances are named 'a'"),
        "missing profile": (missing, "no such file"),
        "advisor error": (advisor, "instance 'a'"),
        "unreachable url": (remote, "instance 'far'"),
        "no instances": ({"instances": []}, "'instances' is empty"),
        "bad policy": ({**good, "router": {"policy": "fastest"}}, "'policy' must be one of"),
        "not yaml": ("instances: [\n", "not valid YAML"),
        "gpus on cpu": (
            {"instances": [{"name": "g", "profile": {"model": str(model)}, "gpus": [0]}]},
            "no NVIDIA GPU",
        ),
        "fallback without a backup": (
            {"instances": good["instances"][:1], "fallback": {"above_ms": 500}},
            "'fallback' needs an instance with role: backup",
        ),
        "fallback on a metric vLLM has not": (
            {**good, "fallback": {"metric": "gpu_temp"}},
            "'metric' must be one of",
        ),
        "fallback unknown key": ({**good, "fallback": {"above": 500}}, "unknown key 'above'"),
        "router open to the network": (
            {**good, "router": {"host": "0.0.0.0"}},
            "opens the router to the network",
        ),
        "router metrics on its own port": (
            {**good, "router": {"port": 18080, "metrics_port": 18080}},
            "port and metrics_port are alike",
        ),
    }


BAD = [
    "unknown top key",
    "unknown instance key",
    "unknown router key",
    "two on one port",
    "instance on the router's port",
    "duplicate names",
    "missing profile",
    "advisor error",
    "unreachable url",
    "no instances",
    "bad policy",
    "not yaml",
    "gpus on cpu",
    "fallback without a backup",
    "fallback on a metric vLLM has not",
    "fallback unknown key",
    "router open to the network",
    "router metrics on its own port",
]


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad file starts nothing: any start of a process fails the test."""

    def spawn(*_: Any, **__: Any) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr("quantdeck.core.runtime.server.spawn", spawn)
    monkeypatch.setattr("quantdeck.core.fleet.supervisor.spawn", spawn)


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("action", ["check", "up"])
def test_a_bad_file_is_one_line_exit_2_and_starts_nothing(
    case: str,
    action: str,
    tmp_path: Path,
    model: Path,
    no_spawn: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("quantdeck.core.fleet.spec.detect_device", lambda: _cpu())
    doc, words = _bad(model, tmp_path)[case]
    assert main(["fleet", action, str(write_fleet(tmp_path, doc))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quantdeck: error: ") and words in err[0], err


def _cpu() -> Any:
    from quantdeck.core.launch import cpu_device

    return cpu_device()


def test_an_overfull_gpu_is_refused(tmp_path: Path) -> None:
    big = write_checkpoint(tmp_path / "big", LLAMA3_8B)
    doc = {
        "instances": [
            {"name": n, "port": port, "gpus": [0], "profile": {"model": str(big)}}
            for n, port in (("p", 8001), ("q", 8002))
        ]
    }
    for inst in doc["instances"]:
        inst["profile"]["gpu-memory-utilization"] = 0.6
    spec = load_fleet(write_fleet(tmp_path, doc))
    with pytest.raises(ConfigError, match=r"GPU 0 is overfull: p 52\.0 GiB \+ q 52\.0 GiB"):
        check_fleet(spec, device=cuda_device(80))
    # shares that add up to 76 of 80 GiB leave no room for what each process holds beyond
    # its share (NVML: 3-4 GiB with vLLM 0.26)
    doc["instances"][1]["profile"]["gpu-memory-utilization"] = 0.35
    with pytest.raises(ConfigError, match=r"p 52\.0 GiB \+ q 32\.0 GiB > 80\.0 GiB \(each"):
        check_fleet(load_fleet(write_fleet(tmp_path, doc)), device=cuda_device(80))
    doc["instances"][1]["profile"]["gpu-memory-utilization"] = 0.3
    check_fleet(load_fleet(write_fleet(tmp_path, doc)), device=cuda_device(80))
    # an explicit KV size counts with the weights it sits beside
    doc["instances"][1]["profile"] = {"model": str(big), "kv-cache-memory-bytes": 30 * 2**30}
    with pytest.raises(ConfigError, match="GPU 0 is overfull"):
        check_fleet(load_fleet(write_fleet(tmp_path, doc)), device=cuda_device(80))
    doc["instances"][1]["gpus"] = [1]
    with pytest.raises(ConfigError, match="instance 'q' names GPU 1, but this machine has 1"):
        check_fleet(load_fleet(write_fleet(tmp_path, doc)), device=cuda_device(80))


def test_instance_events_carry_their_name_and_read_back() -> None:
    inner = StateEvent("ready", url="http://127.0.0.1:8001", t=1.0)
    ev = InstanceEvent("a", inner)
    assert ev.to_json() == {**inner.to_json(), "instance": "a"}
    assert isinstance(ev.event, StateEvent) and ev.event.state == "ready" and ev.instance == "a"
    assert from_json(json.loads(json.dumps(ev.to_json()))) == ev
    # an event without an instance is written as it always was
    assert json.dumps(FactEvent("pid", 7, t=2.0).to_json()) == (
        '{"event": "fact", "name": "pid", "value": 7, "t": 2.0}'
    )


def test_the_fallback_rule_reads_with_its_defaults(tmp_path: Path, model: Path) -> None:
    spec = load_fleet(write_fleet(tmp_path, two(model, fallback={"above_ms": 400, "for_s": 2})))
    assert spec.fallback == FallbackRule("ttft_p99_ms", 400.0, 2.0, 30.0, 10.0)
    assert load_fleet(write_fleet(tmp_path, two(model))).fallback is None
    cmd = router_command(spec, metrics_port=18090)
    assert "--prometheus-port=18090" in cmd and "--prometheus-host=127.0.0.1" in cmd


FLEET_KEYS = ["router", "instances", "routers", "fallback"]


@fuzz_settings(50)
@given(
    doc=st.one_of(
        mutated({"router": {"port": 18080}, "instances": []}, FLEET_KEYS),
        st.builds(
            lambda rule: {
                "instances": [{"name": "b", "url": "http://x", "role": "backup"}],
                "fallback": rule,
            },
            mutated(
                {"metric": "ttft_p99_ms", "above_ms": 500, "for_s": 5},
                ["metric", "above_ms", "for_s", "recover_s", "window_s"],
            ),
        ),
        st.builds(
            lambda inst: {"instances": [inst]},
            mutated(
                {"name": "a", "url": "http://127.0.0.1:9"},
                ["name", "url", "profile", "port", "gpus", "cpus", "role", "restart", "api_key"],
            ),
        ),
        JSON_VALUES,
    )
)
def test_fuzz_the_fleet_reader_fails_in_one_line(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(json.dumps(doc, allow_nan=True))
    try:
        load_fleet(path)
    except QuantdeckError as e:
        one_line_error(e)


def test_an_open_router_is_taken_when_asked_for(tmp_path: Path, model: Path) -> None:
    doc = two(model)
    doc["router"].update(host="0.0.0.0", allow_open=True)
    spec = load_fleet(write_fleet(tmp_path, doc))
    assert spec.router.host == "0.0.0.0" and spec.router.url == "http://127.0.0.1:18080"
    assert "--host=0.0.0.0" in router_command(spec)


def test_an_instance_names_its_engine(tmp_path: Path, model: Path, bare_venv: Path) -> None:
    """``engine:`` (a registered engine's name or an interpreter) serves that instance; a name
    that is none, or an engine without vLLM, is one line naming the instance, and a url
    instance (started elsewhere) takes none."""
    from quantdeck.core.engines import registry_path

    bare = bare_venv
    registry_path().parent.mkdir(parents=True, exist_ok=True)
    entry = {"name": "bare", "python": str(bare), "added": 1.0}
    registry_path().write_text(json.dumps({"version": 1, "engines": [entry]}))
    doc = two(model)
    doc["instances"][0]["engine"] = "bare"
    spec = load_fleet(write_fleet(tmp_path, doc))
    assert (spec.instances[0].engine, spec.instances[1].engine) == (str(bare), None)
    with pytest.raises(ConfigError, match=r"instance 'a': engine python .*: vLLM is not installed"):
        check_fleet(spec)
    doc["instances"][0]["engine"] = "nowhere"
    with pytest.raises(ConfigError, match=r"instance 'a': 'engine': engine 'nowhere': no engine"):
        load_fleet(write_fleet(tmp_path, doc))
    doc["instances"][0] = {"name": "a", "url": "http://10.0.0.2:8000", "engine": "bare"}
    with pytest.raises(ConfigError, match="'engine' is for an instance Quantdeck starts"):
        load_fleet(write_fleet(tmp_path, doc))


def test_a_sleeping_incumbent_counts_in_a_candidates_admission(tmp_path: Path) -> None:
    """After a promotion with sleep mode the retired incumbent sleeps on the GPU, holding what
    NVML said it held asleep: the next candidate is admitted beside the fleet and it."""
    from quantdeck.core.fleet.spec import admit_candidate
    from quantdeck.core.launch.knobs import from_dict

    big = write_checkpoint(tmp_path / "big", LLAMA3_8B)
    doc = {
        "instances": [
            {
                "name": "a",
                "port": 8001,
                "gpus": [0],
                "profile": {"model": str(big), "gpu-memory-utilization": 0.45},
            }
        ]
    }
    spec = load_fleet(write_fleet(tmp_path, doc))
    inst = spec.instances[0]
    cand = from_dict({"model": str(big), "gpu-memory-utilization": 0.45})
    gpu = cuda_device(80)
    fits = admit_candidate(spec, inst, cand, device=gpu)
    assert fits == (
        "GPU 0: a 40.0 GiB + a (candidate) 40.0 GiB = 80.0 of 80.0 GiB "
        "(each instance counted with 4 GiB beyond its share)"
    )
    asleep = {0: [("a~before (asleep)", int(1.5 * 2**30))]}
    with pytest.raises(ConfigError) as e:
        admit_candidate(spec, inst, cand, device=gpu, asleep=asleep)
    assert str(e.value) == (
        "the candidate does not fit beside the fleet on GPU 0: a 40.0 GiB + a (candidate) "
        "40.0 GiB + a~before (asleep) 1.5 GiB = 81.5 GiB > 80.0 GiB "
        "(each instance counted with 4 GiB beyond its share)"
    )
    # a sleeper on another GPU does not count
    assert admit_candidate(spec, inst, cand, device=gpu, asleep={1: asleep[0]}) == fits


def test_sleep_mode_turns_on_vllms_sleep_routes() -> None:
    """vLLM serves /sleep, /wake_up and /is_sleeping only in its dev mode: a launch with sleep
    mode sets it, one without does not."""
    from quantdeck.core.launch.knobs import from_dict, switch_env

    on = from_dict({"model": "m", "enable-sleep-mode": True})
    assert switch_env(on)["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in switch_env(from_dict({"model": "m"}))


def test_a_fleet_of_one_keeps_the_serve_url_and_names_its_key(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --behind-router`: the router takes the serve's host and port, the instance a
    free loopback port; the key is named (env:), never written; the file reads as a fleet."""
    from quantdeck.core.fleet.spec import SERVE_KEY_ENV, fleet_of_one
    from quantdeck.core.launch.knobs import from_dict

    monkeypatch.delenv(SERVE_KEY_ENV, raising=False)
    cfg = from_dict({"model": str(model), "max-num-seqs": 4, "port": 18555})
    cfg.server.api_key = "sk-not-on-disk-1234"
    path = fleet_of_one(cfg, tmp_path / "fleet")
    text = path.read_text()
    assert "sk-not-on-disk" not in text and f"env:{SERVE_KEY_ENV}" in text
    assert path.stat().st_mode & 0o077 == 0
    spec = load_fleet(path)
    assert (spec.router.host, spec.router.port) == ("127.0.0.1", 18555)
    assert spec.router.api_key == "sk-not-on-disk-1234"  # from this process's environment
    (inst,) = spec.instances
    assert inst.name == "serve" and inst.cfg is not None
    assert inst.cfg.scheduler.max_num_seqs == 4 and inst.cfg.server.port != 18555
    assert inst.cfg.server.host == "127.0.0.1" and inst.api_key == "sk-not-on-disk-1234"
    check_fleet(spec)


# -- CPU instances sharing cores -------------------------------------------------------------


def test_cpu_instances_that_would_share_cores_are_warned_with_a_split(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two CPU instances without ``cpus`` bind alike (vLLM's "auto": the first NUMA node's
    cores, both); two that name a CPU both take turns there. A warning, not a refusal, with
    a split of the CPUs the others leave free; a GPU instance and a remote one do not count."""
    from quantdeck.core.fleet.spec import cpu_sharing

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    inst = {"profile": {"model": str(model), "max-num-seqs": 2}}
    doc = {
        "instances": [
            {"name": "a", "port": 18001, **inst},
            {"name": "b", "port": 18002, **inst},
            {"name": "c", "port": 18003, "cpus": "0", **inst},
            {"name": "d", "port": 18004, "cpus": "0-1", **inst},
            {"name": "g", "port": 18005, "gpus": [0], **inst},
            {"name": "far", "url": "http://10.0.0.2:8000"},
        ]
    }
    spec = load_fleet(write_fleet(tmp_path, doc))
    loose, overlap = cpu_sharing(spec, have=set(range(8)))
    assert loose == (
        "instances 'a', 'b' run on the CPU without 'cpus': vLLM binds each one's threads to "
        "the same cores, where they take turns; give each its own 'cpus', e.g. 'cpus: 2-4' for "
        "'a', 'cpus: 5-7' for 'b'"
    )
    assert (
        overlap == "instances 'c' and 'd' both name CPU 0 in 'cpus': their threads take turns there"
    )
    assert cpu_sharing(spec, have={0, 1, 2})[0].endswith(
        "this machine has 1 CPUs free for 2 instances"
    )
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # no binding: the OS spreads them
    assert cpu_sharing(spec, have=set(range(8))) == [overlap]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # inherited alike: the same core
    assert cpu_sharing(spec, have=set(range(8)))[0] == loose
    # one instance without cpus, the others apart: nothing to say
    doc["instances"] = [doc["instances"][0], {**doc["instances"][2], "cpus": "1"}]
    assert cpu_sharing(load_fleet(write_fleet(tmp_path, doc)), have={0, 1}) == []


def test_the_check_says_the_warning_and_the_fleet_news_shows_it(
    tmp_path: Path,
    model: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quantdeck.core.events import AdviceEvent
    from quantdeck.core.fleet.rows import event_line

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    doc = two(model)
    doc["instances"][1].pop("cpus")
    path = write_fleet(tmp_path, doc)
    (warning,) = check_fleet(load_fleet(path))
    assert warning.startswith("instances 'a', 'b' run on the CPU without 'cpus'")
    assert main(["fleet", "check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: warning: {warning}" and len(out) == 2
    assert out[1].startswith(f"{path}: 2 instances, router on ") and out[1].endswith(": ok")
    news = InstanceEvent(
        "router", AdviceEvent({"level": "warning", "knob": "cpus", "message": warning})
    )
    assert event_line(news) == f"router: warning: {warning}"
    assert check_fleet(load_fleet(write_fleet(tmp_path, two(model), "apart.yaml"))) == []


def test_a_trial_candidate_gets_the_cores_the_incumbents_engine_is_not_bound_to() -> None:
    """vLLM's CPU engine binds its worker to the same first core for every server started
    alike: a candidate beside a busy incumbent waited there for over 10 minutes. A real
    process bound to CPU 0 under ``pid``: the other cores are spare; one free to run anywhere
    binds nothing (a GPU engine's), and nothing is said."""
    import os
    import subprocess
    import sys

    from quantdeck.core.fleet.spec import cpu_numbers, machine_cpus, spare_cpus

    have = machine_cpus()
    if len(have) < 2:
        pytest.skip("one CPU: no core to spare")
    first = min(have)
    code = f"import os, sys, time; os.sched_setaffinity(0, {{{first}}}); print(1, flush=True); "
    bound = subprocess.Popen(
        [sys.executable, "-c", code + "time.sleep(60)"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert bound.stdout is not None and bound.stdout.readline().strip() == "1"
        spare = spare_cpus(os.getpid(), have)
        assert spare is not None and set(cpu_numbers(spare)) == have - {first}
    finally:
        bound.kill()
        bound.wait()
    free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert spare_cpus(os.getpid(), have) is None
    finally:
        free.kill()
        free.wait()
    assert spare_cpus(None, have) is None
