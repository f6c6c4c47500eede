"""The API key on the command line: `command` and `profile show` never print it, `profile save
--remember-key` says once that no keyring works; TLS options for attach and bench."""

from __future__ import annotations

import pytest

from quantdeck.cli.main import main
from quantdeck.core.launch import profiles

KEY = "s3cret-KEY-42"


def test_command_masks_the_key(capsys) -> None:
    assert main(["command", "/m", "--api-key", KEY, "--max-num-seqs", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("VLLM_API_KEY=*** vllm serve /m --max-num-seqs=8") and KEY not in out
    assert main(["command", "/m", "--api-key", KEY, "--yaml"]) == 0
    assert KEY not in capsys.readouterr().out


def test_key_from_the_environment_as_vllm_serve_reads_it(capsys, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert main(["command", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("VLLM_API_KEY=*** vllm serve /m") and KEY not in out


def test_profile_save_and_show_never_hold_the_key(capsys, no_keyring) -> None:
    code = main(["profile", "save", "p", "/m", "--api-key", KEY, "--remember-key"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err.startswith("quantdeck: warning: no working keyring") and err.count("\n") == 1
    assert KEY not in profiles.profile_path("p").read_text()
    assert main(["profile", "show", "p"]) == 0
    assert KEY not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["monitor", "bench"])
def test_tls_options_are_checked_before_connecting(capsys, command: str, tmp_path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("nope")
    assert main([command, "https://gpu-box:8000", "--ca-bundle", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantdeck: error: --ca-bundle") and err.count("\n") == 1
    with pytest.raises(SystemExit) as e:
        main([command, "https://gpu-box:8000", "--ca-bundle", str(bad), "--insecure"])
    assert e.value.code == 2
