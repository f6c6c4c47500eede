"""A tuning space (core/bench/space.py): every knob that changes how the engine serves is
tunable (booleans, choices, speculative configs, lists), the engine's other options as
``vllm:NAME``; a knob named twice, a knob that is not tuned, a flag Quantdeck sets and a secret
are refused in one line; a point sets knobs and ``extra_args``, and the offline tuner and the
live chain carry both into their runs, results and the launch they try or save."""

from __future__ import annotations

from typing import Any

import pytest

from quantdeck.core.bench import LiveTuner, TrialOutcome, TuneResult, apply_point, parse_space
from quantdeck.core.bench.ab import ABRun
from quantdeck.core.bench.client import LoadSpec
from quantdeck.core.bench.space import split_values, text_of, tunable_knobs, untuned_reason
from quantdeck.core.bench.tune import Point, Tuner
from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import LaunchConfig, cpu_device, vllm_args
from quantdeck.core.launch.knobs import from_dict, iter_knobs
from quantdeck.core.payloads import Verdict

CPU = cpu_device()


def _cfg() -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    return cfg


def test_booleans_choices_speculative_lists_and_engine_options_read_as_their_options() -> None:
    space = parse_space(
        [
            "enforce_eager=true,false",
            "performance_mode=balanced,throughput",
            "compilation.cudagraph_mode=PIECEWISE,FULL",  # group.name, as knob_by_name reads
            "max-num-seqs=4,8",  # the flag's spelling: the knob's name
            'speculative=none,ngram:3,{"method":"ngram","num_speculative_tokens":2}',
            "cudagraph_capture_sizes=[1,2,4],1 2 4 8",
            "vllm:max_logprobs=5,10",  # as --vllm-arg names it: dashes
            "vllm:enable-log-outputs=true,false",
            'vllm:kv-transfer-config={"kv_role":"kv_both","kv_connector":"X"},0.5',
        ],
        CPU,
        4,
    )
    assert space == {
        "enforce_eager": [True, False],
        "performance_mode": ["balanced", "throughput"],
        "cudagraph_mode": ["PIECEWISE", "FULL"],
        "max_num_seqs": [4, 8],
        "speculative": [None, "ngram:3", '{"method":"ngram","num_speculative_tokens":2}'],
        "cudagraph_capture_sizes": [[1, 2, 4], [1, 2, 4, 8]],
        "vllm:max-logprobs": [5, 10],
        "vllm:enable-log-outputs": [True, False],
        "vllm:kv-transfer-config": [{"kv_role": "kv_both", "kv_connector": "X"}, 0.5],
    }
    # a space's values written back read as they were
    again = [f"{k}={','.join(text_of(v) for v in vs)}" for k, vs in space.items()]
    assert parse_space(again, CPU, 4) == space


def test_the_tunable_knobs_are_the_schemas_serving_knobs_by_one_rule() -> None:
    tunable = tunable_knobs()
    for name in ("enforce_eager", "performance_mode", "cudagraph_mode", "speculative", "dtype"):
        assert name in tunable
    for name in ("model", "quantization", "seed", "enable_lora", "port", "api_key", "kv_events"):
        assert name not in tunable
    for k in iter_knobs():  # the rule, restated: nothing tunable that vLLM never gets
        if k.name in tunable:
            assert not k.quantdeck_only and not k.secret_env and not k.positional
        else:
            assert untuned_reason(k)


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (
            ["max_num_seqs=1,2", "enforce_eager=true", "max-num-seqs=4"],
            "max_num_seqs is given twice",
        ),
        (["vllm:max-logprobs=1", "vllm:max_logprobs=2"], "vllm:max-logprobs is given twice"),
        (["max_num_seqs=2,2"], "the value 2 is given twice"),
        (["seed=1,2"], "model.seed is not tuned"),
        (["kv_events=true,false"], "Quantdeck's own setting"),
        (["api_key=a,b"], "a secret"),
        (["no_such_knob=1"], "quantdeck engines options"),
        (["max_num_seqs"], "expected KNOB=V1,V2"),
        (["enforce_eager=auto"], "enforce_eager"),
        (["vllm:max-num-seqs=4,8"], "tune that knob (max_num_seqs=V1,V2)"),
        (["vllm:enforce-eager=true"], "tune that knob (enforce_eager=V1,V2)"),
        (["vllm:no-enable-chunked-prefill=true"], "tune that knob (enable_chunked_prefill"),
        (["vllm:seed=1,2"], "use its setting model.seed"),
        (["vllm:hf-token=abc"], "a secret is not tuned"),
        (["vllm:api-key=abc"], "VLLM_API_KEY"),
        (["vllm:root-path=/v1"], "--root-path is refused"),
        (["vllm:max-logprobs=1,"], "an empty value"),
    ],
)
def test_a_repeat_an_untuned_knob_a_managed_flag_or_a_secret_is_refused_in_one_line(
    items: list[str], words: str
) -> None:
    with pytest.raises(ConfigError) as e:
        parse_space(items, CPU, 4)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    if "given twice" in words:
        assert "--space" in str(e.value)


def test_an_untuned_knob_is_refused_with_the_tunable_ones_listed() -> None:
    with pytest.raises(ConfigError, match="KNOB one of .*enforce_eager.*vllm:NAME=V1,V2"):
        parse_space(["seed=1,2"], CPU, 4)


def test_values_split_at_commas_outside_brackets_and_quotes() -> None:
    assert split_values('1, [2,3] ,{"a":[1,2],"b":"x,y"}') == [
        "1",
        "[2,3]",
        '{"a":[1,2],"b":"x,y"}',
    ]
    assert split_values("a,'b,c'") == ["a", "'b,c'"]


def test_a_point_sets_knobs_and_engine_options_and_none_leaves_an_option_out() -> None:
    base = _cfg()
    base.extra_args = {"max-logprobs": 3, "scheduling-policy": "fcfs"}
    cfg = apply_point(
        base,
        {"enforce_eager": True, "cudagraph_mode": "FULL", "vllm:max-logprobs": 10},
    )
    assert cfg.compilation.enforce_eager is True and cfg.compilation.cudagraph_mode == "FULL"
    assert cfg.extra_args == {"max-logprobs": 10, "scheduling-policy": "fcfs"}
    assert base.extra_args["max-logprobs"] == 3  # the base is left as it was
    argv = vllm_args(cfg)
    assert "--enforce-eager" in argv and "--max-logprobs=10" in argv
    assert apply_point(base, {"vllm:scheduling-policy": None}).extra_args == {"max-logprobs": 3}
    with pytest.raises(ConfigError, match="not a tunable knob"):
        apply_point(base, {"seed": 1})
    with pytest.raises(ConfigError, match="Quantdeck sets --max-num-seqs itself"):
        apply_point(base, {"vllm:max-num-seqs": 8})  # a saved run edited by hand


class _Scored(Tuner):
    """The tuner's walk and result with goodput scored from the point's values, no server."""

    def measure(self, values: dict[str, Any]) -> Point:
        point = Point(dict(values))
        if point.key() in self.points:
            return self.points[point.key()]
        apply_point(self.base, values)  # every point is a valid launch
        self.points[point.key()] = point
        point.goodput = (2.0 if values["enforce_eager"] is False else 1.0) + (
            0.5 if values["vllm:kv-transfer-config"] == {"kv_role": "kv_both"} else 0.0
        )
        if self.best is None or point.goodput > (self.best.goodput or 0):
            self.best = point
        return point


def test_the_tuner_carries_booleans_and_engine_options_into_its_result_and_best_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ABRun, "preflight", lambda self: None)  # no model to read
    space = parse_space(
        [
            "enforce_eager=true,false",
            'vllm:kv-transfer-config={"kv_role":"kv_producer"},{"kv_role":"kv_both"}',
        ],
        CPU,
        4,
    )
    base = _cfg()
    base.compilation.enforce_eager = True
    tuner = _Scored(base, LoadSpec(num_prompts=4), ttft_ms=100, tpot_ms=50, space=space)
    result = tuner.run()
    # from the base's eager and the option's middle value: graphs gain, the other option not
    producer, both = {"kv_role": "kv_producer"}, {"kv_role": "kv_both"}
    assert [p.values for p in result.points] == [
        {"enforce_eager": True, "vllm:kv-transfer-config": both},
        {"enforce_eager": False, "vllm:kv-transfer-config": both},
        {"enforce_eager": False, "vllm:kv-transfer-config": producer},
    ]
    assert result.best is not None and result.best.values == result.points[1].values
    best = from_dict(result.best_config)
    assert best.compilation.enforce_eager is False
    assert best.extra_args == {"kv-transfer-config": {"kv_role": "kv_both"}}
    assert TuneResult.from_json(result.to_json()) == result  # a saved run reads back


class _Fleet:
    """An instance's launch and a trial that promotes the candidates ``wins`` says."""

    def __init__(self, wins: set[str]) -> None:
        self.cfg = _cfg()
        self.wins = wins
        self.tried: list[LaunchConfig] = []

    def launch(self) -> LaunchConfig:
        return self.cfg.copy()

    def trial(self, cfg: LaunchConfig) -> TrialOutcome:
        self.tried.append(cfg)
        key = "eager" if cfg.compilation.enforce_eager else "graphs"
        key += "+" + str(cfg.extra_args.get("max-logprobs"))
        if key in self.wins:
            self.cfg = cfg.copy()
            return TrialOutcome("promoted", "better", "promote", Verdict("better"))
        return TrialOutcome("rolled back", "worse", "rollback", Verdict("worse"))


def test_the_live_chain_tries_a_boolean_and_an_engine_option_on_the_running_launch() -> None:
    fleet = _Fleet({"eager+None"})
    space = parse_space(["enforce_eager=false,true", "vllm:max-logprobs=5,10"], CPU, None)
    result = LiveTuner(space).run(fleet.launch, fleet.trial)
    # eager flipped on the running launch (promoted), then the option on the eager launch
    assert [(c.compilation.enforce_eager, dict(c.extra_args)) for c in fleet.tried] == [
        (True, {}),
        (True, {"max-logprobs": 5}),
        (True, {"max-logprobs": 10}),
    ]
    assert [t.knobs for t in result.trials] == [
        {"enforce_eager": [False, True]},
        {"vllm:max-logprobs": [None, 5]},
        {"vllm:max-logprobs": [None, 10]},
    ]
    assert result.start == {"enforce_eager": False, "vllm:max-logprobs": None}
    assert result.best == {"enforce_eager": True, "vllm:max-logprobs": None}
    assert result.changed == {"enforce_eager": [False, True]}
