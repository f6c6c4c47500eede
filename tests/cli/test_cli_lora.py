"""``quantdeck demo-lora``, ``models`` with an adapter, and ``lora load|unload|list``: parsing,
the adapter written, and one-line errors against no server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.cli.main import build_parser, main


def test_lora_commands_parse() -> None:
    p = build_parser()
    ns = p.parse_args(["lora", "load", "http://h:8000", "mine", "/a/b"])
    assert (ns.action, ns.url, ns.name, ns.path) == ("load", "http://h:8000", "mine", "/a/b")
    ns = p.parse_args(["lora", "unload", "http://h:8000", "mine", "--api-key", "k"])
    assert (ns.action, ns.name, ns.api_key) == ("unload", "mine", "k")
    assert p.parse_args(["lora", "list", "http://h:8000", "--json"]).json
    for bad in (["lora"], ["lora", "load", "http://h:8000", "mine"], ["lora", "drop", "u"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(bad)
        assert e.value.code == 2


def test_demo_lora_writes_an_adapter_the_library_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_checkpoint(tmp_path / "lib" / "base", TINY_LLAMA)
    assert main(["demo-lora", str(tmp_path / "lib" / "lora"), "--base", str(base)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "lib" / "lora")
    assert main(["models", str(tmp_path / "lib"), "--no-hf-cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [ln for ln in lines if "LoRA-8" in ln]
    assert f"(adapter of {base})" in line


def test_lora_against_no_server_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert main(["lora", "list", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quantdeck: error: ") and "\n" not in err and "from-env" not in err
