"""``fleet undo``'s refusals, before anything starts (its real run is in
tests/cli/test_fleet_trial_server.py and, from sleep, in docs/gpu-validation.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.errors import ConfigError
from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.fleet.supervisor import Retired
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch.knobs import from_dict


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    doc = {
        "router": {"port": 18180},
        "instances": [{"name": "a", "port": 18101, "profile": {"model": str(model)}}],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return Fleet(load_fleet(path))


def test_nothing_promoted_is_nothing_to_undo(fleet: Fleet) -> None:
    with pytest.raises(ConfigError, match="^instance 'a' has no promotion to undo in this fleet$"):
        fleet.undo("a")
    with pytest.raises(ConfigError, match="^instance 'b' has no promotion to undo"):
        fleet.undo("b")


def test_an_undo_waits_for_the_instance_to_serve(fleet: Fleet) -> None:
    """A promotion kept, but the instance is down (nothing runs here): refused, and the
    launch from before stays kept for a later undo."""
    before = from_dict({"model": "m", "max-num-seqs": 1})
    fleet.retired["a"] = Retired(before, "max_num_seqs 1 -> 8")
    with pytest.raises(ConfigError, match="^instance .a. does not serve now: undo it once"):
        fleet.undo("a")
    assert fleet.retired["a"].cfg is before and fleet.trial is None


def test_a_trial_that_changes_no_knob_is_refused_before_anything_starts(
    fleet: Fleet,
) -> None:
    """As A/B refuses identical arms: a candidate with the instance's own knobs (its port,
    host and API key are the fleet's to give, so they are no change) would cost a restart
    to compare the instance with itself. (The instance is made to read as serving: nothing
    runs here.)"""
    inst = fleet.spec.instances[0]
    assert inst.cfg is not None
    fleet.servers["a"].state = "ready"
    fleet._router_ready.set()
    same = inst.cfg.copy()
    same.server.port += 7
    with pytest.raises(ConfigError, match="^the candidate changes no knob of 'a' \\(it runs "):
        fleet.start_trial("a", same, TrialOptions())
    assert fleet.trial is None
    same.server.host, same.server.api_key = "0.0.0.0", "another"  # the fleet's, not knobs
    with pytest.raises(ConfigError, match="changes no knob"):
        fleet.start_trial("a", same, TrialOptions())
