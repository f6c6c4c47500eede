"""Tune, live (core/bench/live_tune.py): the coordinate walk over trial outcomes, the chain's
budget, refused candidates skipped, promotions rebasing the next candidates, the goal
(``until``) met by a promoted launch. The trials here are a table of outcomes (what the fleet
would decide): the chain on real parts is tests/cli/test_tune_live_server.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from quantdeck.core.bench import LiveSearch, LiveTuner, TrialOutcome
from quantdeck.core.bench.live_tune import goal_met, until_text, walks
from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.events import Event, LiveTuneEvent, from_json
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.payloads import ArmFigures, Verdict

SEQS = "max_num_seqs"
TOKENS = "max_num_batched_tokens"


def _chain(
    space: dict[str, list[Any]], start: dict[str, Any], winners: set[tuple[tuple[str, Any], ...]]
) -> list[dict[str, Any]]:
    """The candidates a search tries from ``start`` when exactly ``winners`` (points as sorted
    items) are promoted and every other candidate is rolled back."""
    s = LiveSearch(space, start)
    tried = []
    while (point := s.next()) is not None:
        tried.append(point)
        s.tell("promoted" if tuple(sorted(point.items())) in winners else "rolled back")
    return tried


def _p(**values: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(values.items()))


def test_walks_from_a_listed_value_between_two_and_from_an_unplaceable_one() -> None:
    assert walks(4, [1, 2, 4, 8, 16]) == ("walk", [[8, 16], [2, 1]])
    assert walks(1, [1, 8]) == ("walk", [[8], []])
    assert walks(6, [16, 1, 4, 8]) == ("walk", [[8, 16], [4, 1]])  # placed by value
    assert walks(None, [4, 8]) == ("each", [[4, 8]])  # unset: vLLM's default
    assert walks("balanced", ["throughput", "interactivity"]) == (
        "each",
        [["throughput", "interactivity"]],
    )
    assert walks(True, [True, False]) == ("walk", [[False], []])


def test_a_two_value_space_is_one_trial_whatever_its_outcome() -> None:
    space = {SEQS: [1, 8]}
    assert _chain(space, {SEQS: 1}, {_p(max_num_seqs=8)}) == [{SEQS: 8}]
    assert _chain(space, {SEQS: 1}, set()) == [{SEQS: 8}]
    assert _chain(space, {SEQS: 8}, set()) == [{SEQS: 1}]


def test_the_walk_goes_up_while_promoted_and_down_only_when_the_first_step_up_lost() -> None:
    space = {SEQS: [1, 2, 4, 8, 16]}
    up = _chain(space, {SEQS: 4}, {_p(max_num_seqs=8)})
    assert up == [{SEQS: 8}, {SEQS: 16}]  # 8 won, 16 lost: no walk down
    down = _chain(space, {SEQS: 4}, {_p(max_num_seqs=2)})
    assert down == [{SEQS: 8}, {SEQS: 2}, {SEQS: 1}]  # 8 lost: down; 2 won, 1 lost
    between = _chain({SEQS: [1, 4, 16]}, {SEQS: 6}, set())
    assert between == [{SEQS: 16}, {SEQS: 4}]  # the nearest each way


def test_an_unplaceable_value_tries_each_candidate_against_the_best_so_far() -> None:
    space = {SEQS: [4, 8, 16]}
    tried = _chain(space, {SEQS: None}, {_p(max_num_seqs=8)})
    # 4 lost, 8 won, 16 tried against 8 (lost); then 8 is placed: 16 and 4 were tried
    assert tried == [{SEQS: 4}, {SEQS: 8}, {SEQS: 16}]


def test_a_promotion_rebases_the_next_knobs_and_earns_another_pass() -> None:
    space = {SEQS: [1, 8], TOKENS: [512, 2048]}
    start = {SEQS: 1, TOKENS: 512}
    winners = {_p(max_num_seqs=1, max_num_batched_tokens=2048)}
    tried = _chain(space, start, winners)
    assert tried == [
        {SEQS: 8, TOKENS: 512},  # lost
        {SEQS: 1, TOKENS: 2048},  # won: the incumbent from now
        {SEQS: 8, TOKENS: 2048},  # the second pass: SEQS again, beside the new best
    ]
    # no promotion in a pass: one pass only, and a point is never tried twice
    assert _chain(space, start, set()) == [{SEQS: 8, TOKENS: 512}, {SEQS: 1, TOKENS: 2048}]


def test_a_refused_candidate_is_skipped_and_the_walk_goes_on_the_same_way() -> None:
    s = LiveSearch({SEQS: [1, 64, 8]}, {SEQS: 1})
    assert s.next() == {SEQS: 64}
    s.tell("refused")  # it does not fit: skipped
    assert s.next() == {SEQS: 8}
    s.tell("promoted")
    assert s.best == {SEQS: 8}
    # the second pass: 64 (refused before) is not asked again, 1 was the incumbent beaten
    assert s.next() is None


def test_the_search_is_told_one_outcome_per_candidate() -> None:
    s = LiveSearch({SEQS: [1, 8]}, {SEQS: 1})
    with pytest.raises(RuntimeError):
        s.tell("promoted")
    s.next()
    with pytest.raises(RuntimeError):
        s.next()
    with pytest.raises(ValueError):
        s.tell("won")
    with pytest.raises(ConfigError, match="tunable"):
        LiveSearch({"seed": [1]}, {"seed": 0})


class FakeFleet:
    """The instance's launch as the fleet holds it, and a table of what each candidate comes
    to (``outcomes``: ``{(knob, value): result}``; rolled back where not listed)."""

    def __init__(self, outcomes: dict[tuple[str, Any], str] | None = None) -> None:
        self.cfg = LaunchConfig()
        self.cfg.model.model = "/models/demo"
        self.cfg.scheduler.max_num_seqs = 1
        self.cfg.scheduler.max_num_batched_tokens = 512
        self.outcomes = outcomes or {}
        self.tried: list[LaunchConfig] = []
        self.gone = False

    def launch(self) -> LaunchConfig:
        if self.gone:
            raise ServerError("no fleet running")
        return self.cfg.copy()

    def trial(self, cfg: LaunchConfig) -> TrialOutcome:
        self.tried.append(cfg)
        seqs, tokens = cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens
        changed = (SEQS, seqs) if seqs != self.cfg.scheduler.max_num_seqs else (TOKENS, tokens)
        result = self.outcomes.get(changed, "rolled back")
        if result == "promoted":
            self.cfg = cfg.copy()
            return TrialOutcome("promoted", "ttft_p99: better", "promote", Verdict("better"))
        if result == "refused":
            return TrialOutcome("refused", "'a (candidate)' does not fit: 9 GiB > 8 GiB")
        if result == "failed":
            self.gone = True
            return TrialOutcome("failed", "the fleet went away before the decision")
        return TrialOutcome("rolled back", "worse: ttft_p99", "rollback", Verdict("worse"))


def test_a_chain_promotes_a_winner_and_the_next_candidate_changes_it() -> None:
    fleet = FakeFleet({(SEQS, 8): "promoted"})
    events: list[Event] = []
    tuner = LiveTuner({SEQS: [1, 8], TOKENS: [512, 2048]}, on_event=events.append)
    result = tuner.run(fleet.launch, fleet.trial)
    assert [c.scheduler.max_num_seqs for c in fleet.tried] == [8, 8]
    # the second candidate is the promoted launch with the next knob changed
    assert [c.scheduler.max_num_batched_tokens for c in fleet.tried] == [512, 2048]
    assert [t.result for t in result.trials] == ["promoted", "rolled back"]
    assert result.trials[0].knobs == {SEQS: [1, 8]}
    assert result.trials[1].knobs == {TOKENS: [512, 2048]}
    assert result.trials[0].decision == "promote"
    assert result.trials[0].outcome == "better"
    assert result.best == {SEQS: 8, TOKENS: 512} and result.changed == {SEQS: [1, 8]}
    assert result.launch["max-num-seqs"] == 8 and not result.failed
    assert result.ended == "the space is exhausted: no candidate left to try"
    phases = [(e.phase, e.step) for e in events if isinstance(e, LiveTuneEvent)]
    assert phases == [("trying", 1), ("tried", 1), ("trying", 2), ("tried", 2), ("finished", 0)]
    for e in events:  # typed, and each reads back as it was written
        assert from_json(e.to_json()) == e
    finished = events[-1]
    assert isinstance(finished, LiveTuneEvent)
    assert finished.trials == [t.to_json() for t in result.trials]
    assert finished.describe() == (
        "[tune] finished: 2 trials, 1 promoted (the space is exhausted: no candidate left to try)"
    )
    assert (
        events[1].describe() == "[tune] trial 1: max_num_seqs 1 -> 8: promoted (ttft_p99: better)"
    )


def test_refused_candidates_are_reported_skipped_and_not_counted_in_the_budget() -> None:
    fleet = FakeFleet({(SEQS, 64): "refused", (SEQS, 8): "promoted"})
    events: list[Event] = []
    tuner = LiveTuner({SEQS: [1, 64, 8, 16]}, budget=2, on_event=events.append)
    result = tuner.run(fleet.launch, fleet.trial)
    assert [(t.knobs, t.result) for t in result.trials] == [
        ({SEQS: [1, 64]}, "refused"),
        ({SEQS: [1, 8]}, "promoted"),
        ({SEQS: [8, 16]}, "rolled back"),
    ]
    # two trials ran (the refused one did not count): the third candidate was still tried
    assert result.ended == "the space is exhausted: no candidate left to try"
    refused = [e for e in events if isinstance(e, LiveTuneEvent) and e.result == "refused"]
    assert refused and "does not fit" in str(refused[0].reason)


def test_the_budget_of_trials_and_of_seconds_ends_the_chain() -> None:
    space = {SEQS: [1, 2, 4, 8, 16]}
    fleet = FakeFleet({(SEQS, v): "promoted" for v in (2, 4, 8, 16)})
    result = LiveTuner(space, budget=2).run(fleet.launch, fleet.trial)
    assert len(result.trials) == 2 and result.ended == "the budget: 2 trials"
    assert fleet.cfg.scheduler.max_num_seqs == 4

    now = [0.0]

    def trial(cfg: LaunchConfig) -> TrialOutcome:
        now[0] += 100.0  # each trial takes 100 s
        return fleet2.trial(cfg)

    fleet2 = FakeFleet({(SEQS, v): "promoted" for v in (2, 4, 8, 16)})
    tuner = LiveTuner(space, budget_s=250, clock=lambda: now[0])
    result = tuner.run(fleet2.launch, trial)
    assert len(result.trials) == 3 and result.ended == "the budget: 250 s"
    with pytest.raises(ConfigError, match="budget"):
        LiveTuner(space, budget=0)
    with pytest.raises(ConfigError, match="budget-s"):
        LiveTuner(space, budget_s=0)
    with pytest.raises(ConfigError, match="empty"):
        LiveTuner({})


def test_a_candidate_that_is_no_valid_launch_is_refused_without_asking_the_fleet() -> None:
    fleet = FakeFleet()
    result = LiveTuner({SEQS: [0, 1, 4]}).run(fleet.launch, fleet.trial)
    assert [c.scheduler.max_num_seqs for c in fleet.tried] == [4]  # 0 never reached the fleet
    assert [t.result for t in result.trials] == ["rolled back", "refused"]
    assert "max_num_seqs" in result.trials[1].reason


def test_the_fleet_going_away_stops_the_chain_and_a_cancel_stops_it_between_trials() -> None:
    fleet = FakeFleet({(SEQS, 8): "failed"})
    result = LiveTuner({SEQS: [1, 8, 16]}).run(fleet.launch, fleet.trial)
    assert result.failed and result.ended.startswith("the fleet went away")
    assert len(result.trials) == 1

    fleet = FakeFleet()
    tuner = LiveTuner({SEQS: [1, 8], TOKENS: [512, 2048]})

    def trial(cfg: LaunchConfig) -> TrialOutcome:
        tuner.cancel()  # a stop signal during the first trial
        return fleet.trial(cfg)

    result = tuner.run(fleet.launch, trial)
    assert len(result.trials) == 1 and result.ended == "stopped" and result.cancelled


def test_a_space_of_running_values_only_runs_nothing() -> None:
    fleet = FakeFleet()
    result = LiveTuner({SEQS: [1]}).run(fleet.launch, fleet.trial)
    assert result.trials == [] and result.ended == "nothing ran: no candidate to try"
    assert fleet.tried == [] and result.changed == {}


# -- until the goal ------------------------------------------------------------------------------
class GoalFleet(FakeFleet):
    """FakeFleet whose promoted candidates report the candidate arm's TTFT p99: ``ttft`` ms
    per max_num_seqs value (every other value rolled back)."""

    def __init__(self, ttft: dict[int, float]) -> None:
        super().__init__({(SEQS, v): "promoted" for v in ttft})
        self.ttft = ttft

    def trial(self, cfg: LaunchConfig) -> TrialOutcome:
        out = super().trial(cfg)
        seqs = cfg.scheduler.max_num_seqs or 0
        figures = ArmFigures(ttft_p99_ms=self.ttft.get(seqs), itl_p99_ms=40.0, requests=30)
        return dataclasses.replace(out, figures=figures)


def test_the_chain_stops_once_a_promoted_launch_meets_the_goal() -> None:
    fleet = GoalFleet({2: 400.0, 4: 150.0, 8: 90.0})
    events: list[Event] = []
    tuner = LiveTuner({SEQS: [1, 2, 4, 8, 16]}, until={"ttft_p99": 200.0}, on_event=events.append)
    result = tuner.run(fleet.launch, fleet.trial)
    # 2 was promoted but misses (400 ms); 4 meets (150 ms): 8 and 16 are never tried
    assert [c.scheduler.max_num_seqs for c in fleet.tried] == [2, 4]
    assert [t.meets for t in result.trials] == [False, True]
    assert result.goal_met is True and result.met_by == 2
    assert result.until == {"ttft_p99": 200.0}
    assert result.ended == "the goal: trial 2's launch meets it (ttft_p99 150 ms <= 200 ms)"
    tried = [e for e in events if isinstance(e, LiveTuneEvent) and e.phase == "tried"]
    assert [e.meets for e in tried] == [False, True]
    assert tried[1].describe().endswith("promoted (ttft_p99: better); meets the goal")
    for e in events:
        assert from_json(e.to_json()) == e


def test_a_goal_no_promoted_launch_meets_is_said_so_and_rolled_back_figures_never_count() -> None:
    fleet = GoalFleet({2: 400.0})
    until = {"ttft_p99": 200.0, "itl_p99": 50.0}
    result = LiveTuner({SEQS: [1, 2, 4]}, until=until).run(fleet.launch, fleet.trial)
    assert [t.result for t in result.trials] == ["promoted", "rolled back"]
    # a rolled-back trial is never held against the goal (its figures are not the launch's)
    assert [t.meets for t in result.trials] == [False, None]
    assert result.goal_met is False and result.met_by is None
    assert result.ended == "the space is exhausted: no candidate left to try"
    # without a goal the chain says nothing of one
    plain = LiveTuner({SEQS: [1, 2]}).run(GoalFleet({2: 1.0}).launch, GoalFleet({2: 1.0}).trial)
    assert plain.goal_met is None and "meets" not in plain.trials[0].to_json()


def test_goal_readings_and_limits_the_trials_do_not_report() -> None:
    assert goal_met({"ttft_p99": 200.0}, ArmFigures(ttft_p99_ms=200.0)) == (
        True,
        "ttft_p99 200 ms <= 200 ms",
    )
    assert goal_met({"e2e_p50": 900.0, "itl_p99": 50.0}, ArmFigures(e2e_p50_ms=1000.0)) == (
        False,
        "e2e_p50 1000 ms > 900 ms, itl_p99: no figure",
    )
    assert goal_met({"ttft_p99": 1.0}, None)[0] is False
    with pytest.raises(ConfigError, match="--until ttft_p90: the trials report"):
        LiveTuner({SEQS: [1, 2]}, until={"ttft_p90": 100.0})
    with pytest.raises(ConfigError, match="positive"):
        LiveTuner({SEQS: [1, 2]}, until={"ttft_p99": 0.0})
    assert until_text({"ttft_p99": 200.0, "itl_p99": 50.5}) == "ttft_p99<=200ms,itl_p99<=50.5ms"
