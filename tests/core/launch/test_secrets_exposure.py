"""The API key: in vLLM's environment only, masked wherever a command is shown, never in a
file; a keyring or nothing for remembered keys. Exposure beyond loopback; TLS for attach."""

from __future__ import annotations

import ssl
import stat
from collections.abc import Iterator
from pathlib import Path

import certifi
import keyring
import pytest
from ckpt import LLAMA3_8B, write_checkpoint
from keyring.backend import KeyringBackend

from quantdeck.core.errors import ConfigError
from quantdeck.core.http import configure_tls, is_loopback, plain_http_warning, tls_verify
from quantdeck.core.launch import LaunchConfig, advise, knobs, profiles
from quantdeck.core.launch.device import H200
from quantdeck.core.models import inspect_model

KEY = "s3cret-KEY-42"


def _cfg(key: str | None = KEY) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    cfg.scheduler.max_num_seqs = 8
    cfg.server.api_key = key
    return cfg


def test_key_goes_to_the_environment_only() -> None:
    cfg = _cfg()
    assert not any(KEY in w for w in knobs.serve_command(cfg))
    assert knobs.vllm_env(cfg) == {"VLLM_API_KEY": KEY}
    line = knobs.command_line(cfg)
    assert line.startswith("VLLM_API_KEY=*** vllm serve /m ") and KEY not in line
    for text in (knobs.to_yaml(cfg), knobs.to_yaml(cfg, for_vllm=True), str(knobs.to_dict(cfg))):
        assert KEY not in text and "api-key" not in text
    # no key: passed empty, so a VLLM_API_KEY of the user's own cannot lock Quantdeck out
    assert knobs.vllm_env(_cfg(None)) == {"VLLM_API_KEY": ""}
    assert not knobs.command_line(_cfg(None)).startswith("VLLM_API_KEY")


def test_a_bad_key_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError, match="server.api_key: the value holds a control") as e:
        knobs.validate(_cfg("abc\ndef"))
    assert "abc" not in str(e.value)


def test_quantdeck_settings_stay_out_of_vllm() -> None:
    cfg = _cfg()
    cfg.server.allow_open = True
    assert not any("allow" in w for w in knobs.vllm_args(cfg))
    assert "allow-open" not in knobs.to_dict(cfg, for_vllm=True)
    assert knobs.from_yaml(knobs.to_yaml(cfg)).server.allow_open  # a profile keeps it


@pytest.fixture
def memory_keyring() -> Iterator[dict[tuple[str, str], str]]:
    store: dict[tuple[str, str], str] = {}

    class Memory(KeyringBackend):
        priority = 1  # type: ignore[assignment]

        def get_password(self, service: str, username: str) -> str | None:
            return store.get((service, username))

        def set_password(self, service: str, username: str, password: str) -> None:
            store[(service, username)] = password

        def delete_password(self, service: str, username: str) -> None:
            store.pop((service, username), None)

    old = keyring.get_keyring()
    keyring.set_keyring(Memory())
    yield store
    keyring.set_keyring(old)


def test_saved_profile_is_private_and_keyless(no_keyring) -> None:
    path = profiles.save_profile("p", _cfg())
    assert KEY not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert profiles.load_profile("p").server.api_key is None


def test_no_keyring_says_so_and_keeps_nothing(no_keyring) -> None:
    profiles.save_profile("p", _cfg())
    problem = profiles.remember_key("p", KEY)
    assert problem and "not remembered" in problem and "\n" not in problem
    assert profiles.load_profile("p").server.api_key is None


def test_keyring_remembers_a_profiles_key(memory_keyring) -> None:
    path = profiles.save_profile("p", _cfg())
    assert profiles.remember_key("p", KEY) is None
    assert KEY not in path.read_text() and list(memory_keyring.values()) == [KEY]
    assert profiles.load_profile("p").server.api_key == KEY
    profiles.delete_profile("p")
    assert memory_keyring == {}


# -- exposure -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.20", False),
        ("myhost.lan", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("m") / "l8b", LLAMA3_8B)


def _host_findings(llama: Path, host: str, key: str | None, allow_open: bool = False) -> list:
    cfg = _cfg(key)
    cfg.model.model = str(llama)
    cfg.server.host, cfg.server.allow_open = host, allow_open
    return [f for f in advise(cfg, inspect_model(llama), H200) if f.knob == "host"]


def test_open_server_without_key_is_an_error(llama: Path) -> None:
    for host in ("0.0.0.0", "::", "192.168.1.20"):
        (f,) = _host_findings(llama, host, None)
        assert f.level == "error" and "no API key" in f.message
        assert "--allow-open" in f.message and "every route is open" in f.message
    (f,) = _host_findings(llama, "0.0.0.0", KEY)  # what the engine's key guard leaves open
    assert (
        f.level == "warning"
        and "only /health, /metrics, /tokenize and /detokenize answer" in f.message
    )
    (f,) = _host_findings(llama, "0.0.0.0", None, allow_open=True)
    assert f.level == "warning" and "every route is open" in f.message
    assert _host_findings(llama, "127.0.0.1", None) == []


# -- TLS and keys on the wire ---------------------------------------------------------------


@pytest.fixture
def tls_reset() -> Iterator[None]:
    yield
    configure_tls()


def test_tls_options(tls_reset, tmp_path: Path) -> None:
    assert tls_verify("http://h:8000") is False
    assert tls_verify("https://h") is True
    configure_tls(insecure=True)
    assert tls_verify("https://h") is False
    configure_tls(ca_bundle=certifi.where())
    assert isinstance(tls_verify("https://h"), ssl.SSLContext)
    assert tls_verify("http://h") is False
    with pytest.raises(ConfigError, match="exclude each other"):
        configure_tls(ca_bundle=certifi.where(), insecure=True)
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError, match="not a readable PEM"):
        configure_tls(ca_bundle=str(bad))


@pytest.mark.parametrize(
    "url, key, warns",
    [
        ("http://10.0.0.5:8000", KEY, True),
        ("HTTP://gpu-box:8000/", KEY, True),
        ("https://10.0.0.5:8000", KEY, False),
        ("http://127.0.0.1:8000", KEY, False),
        ("http://[::1]:8000", KEY, False),
        ("http://10.0.0.5:8000", None, False),
    ],
)
def test_key_over_plain_http_warns(url: str, key: str | None, warns: bool) -> None:
    w = plain_http_warning(url, key)
    assert (w is not None) is warns
    if w:
        assert "plain http" in w and KEY not in w
