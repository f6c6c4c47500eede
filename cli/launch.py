"""Launch planning: the memory plan, the `vllm serve` command, profiles."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quantdeck.cli._common import (
    AddCommand,
    add_device,
    add_engine,
    add_model_and_knobs,
    config_from,
    device_from,
    engine_from,
    fit_for_engine,
    human_bytes,
    print_json,
)
from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import LaunchConfig, RayFacts, knobs, profiles
from quantdeck.core.launch.planner import same_groups


def _plan_and_advise(
    ns: argparse.Namespace,
) -> tuple[LaunchConfig, Any, Any, list[Any], RayFacts | None, Any]:
    from quantdeck.core.launch import advise, cpu_device, local_vllm_version, plan, with_ray
    from quantdeck.core.launch.planner import version_tuple
    from quantdeck.core.models import inspect_model

    cfg = config_from(ns)
    caps = None
    if ns.engine is not None:  # that engine's version rules and options
        if ns.vllm_version is not None:
            raise ConfigError("--vllm-version and --engine: give one (the engine has its version)")
        cfg, notes = fit_for_engine(ns, cfg)  # a profile saved with another vLLM, migrated
        for note in notes:
            print(f"quantdeck: note: {note}", file=sys.stderr)
        caps = engine_capabilities(ns)
        cfg = knobs.for_engine(cfg, caps)
    info = inspect_model(cfg.model.model)
    dev = device_from(ns)
    if caps is not None and caps.platform != "cuda" and ns.gpu_memory_gib is None:
        dev = cpu_device()  # as the server plans: a CPU engine serves on this machine's CPU
    dev = with_ray(dev, cfg, python=caps.python if caps else None)  # the ray backend's facts
    version = caps.vllm_version if caps else ns.vllm_version or local_vllm_version()
    if ns.vllm_version is not None and len(version_tuple(ns.vllm_version)) < 2:
        raise ConfigError(f"--vllm-version: '{ns.vllm_version}' is not a version like 0.26.0")
    kv = plan(cfg, info, dev, vllm_version=version)
    return cfg, info, kv, advise(cfg, info, dev, kv), dev.ray, caps


def engine_capabilities(ns: argparse.Namespace) -> Any:
    """The capabilities of the engine ``--engine`` names (the default engine without it):
    probed once per engine and vLLM version, then cached."""
    from quantdeck.core.runtime import EngineEnv

    return EngineEnv(engine_from(ns)).capabilities()


# `plan`'s exit status when the launch does not fit (the plan is printed all the same), so
# that a script can ask `quantdeck plan MODEL [knobs] --json && quantdeck serve ...`; a user's
# error stays 2
DOES_NOT_FIT = 1


def cmd_plan(ns: argparse.Namespace) -> int:
    cfg, info, kv, findings, ray, caps = _plan_and_advise(ns)
    out = kv.to_json()
    out["model"] = info.path
    out["engine"] = caps.label if caps is not None else None
    if ray is not None:
        out["ray"] = ray.to_json()
    out["errors"] = [f.message for f in findings if f.level == "error"]
    out["warnings"] = [f.message for f in findings if f.level == "warning"]
    out["fits"] = kv.fits and not out["errors"]
    code = 0 if out["fits"] else DOES_NOT_FIT
    if ns.json:
        print_json(out)
        return code
    print(f"device        {kv.device}")
    if caps is not None:
        print(f"engine        {caps.label}")
    print(f"model         {info.path} ({info.badge})")
    for label, key in (
        ("budget", "budget_bytes"),
        ("weights", "weights_bytes"),
        ("activations", "activation_bytes"),
        ("CUDA graphs", "cudagraph_bytes"),
        ("non-torch", "non_torch_bytes"),
        ("KV cache", "kv_cache_bytes"),
    ):
        print(f"{label:<13} {human_bytes(out[key])}")
    print(
        f"KV cache      {kv.kv_cache_tokens:,} tokens in {kv.num_blocks:,} blocks of "
        f"{kv.block_size} ({human_bytes(kv.kv_bytes_per_token)} per token)"
    )
    print(f"concurrency   {kv.max_concurrency}x at max_model_len {kv.max_model_len}")
    if kv.offload_bytes:
        print(
            f"KV offload    {human_bytes(kv.offload_bytes)} of CPU memory: "
            f"{kv.offload_tokens:,} tokens of evicted blocks kept for prefix-cache reuse"
        )
    if len(kv.groups) > 1 or any(g.kind != "full_attention" for g in kv.groups):
        print(f"KV groups     {len(kv.groups)}, a block is {human_bytes(kv.bytes_per_block)}:")
        for n, g in same_groups(kv.groups):
            window = f", window {g.window}" if g.window else ""
            print(
                f"  {n} x {g.kind}: {g.layers} layer{'s' * (g.layers != 1)} of "
                f"{human_bytes(g.page_bytes)} pages, {g.block_size} tokens a block{window}; "
                f"{g.blocks_per_seq} blocks per max_model_len sequence"
            )
    if ray is not None and ray.reachable:
        print(
            f"Ray cluster   {ray.address}: {ray.nodes} node{'s' * (ray.nodes != 1)}, "
            f"{ray.gpus:g} GPUs, {ray.cpus:g} CPUs"
        )
    print(f"fits          {'yes' if out['fits'] else 'no'}")
    for m in out["errors"]:
        print(f"error: {m}")
    for m in out["warnings"]:
        print(f"warning: {m}")
    return code


def cmd_command(ns: argparse.Namespace) -> int:
    cfg = config_from(ns)
    if ns.profile or ns.engine is not None:
        # as `serve` fits them before anything starts: a profile migrated from the vLLM it was
        # saved with to the engine the command is for (the default one without --engine), then
        # every flag checked against that engine's own parser (one it lacks: one line naming
        # the engine and its version)
        cfg, notes = fit_for_engine(ns, cfg)
        for note in notes:
            print(f"quantdeck: note: {note}", file=sys.stderr)
    elif cfg.extra_args:  # the engine's options, typed as it takes them
        cfg = knobs.for_engine(cfg, engine_capabilities(ns))
    if ns.yaml:  # never holds the key: vLLM reads it from VLLM_API_KEY
        sys.stdout.write(knobs.to_yaml(cfg, for_vllm=True))
    elif ns.as_run:  # the launch plan: what `serve` (and the panel's Start) runs, as Copy has it
        from quantdeck.core.launch import detect_device
        from quantdeck.core.launch.command import launch_plan
        from quantdeck.core.runtime import EngineEnv

        env = EngineEnv(engine_from(ns))
        plan = launch_plan(cfg, env.capabilities(), detect_device(), python=env.python)
        print(plan.shell_line())  # a secret as NAME=***; what the start chooses as <...>
    else:
        print(knobs.command_line(cfg))  # the key shows as VLLM_API_KEY=***
    return 0


def cmd_profile(ns: argparse.Namespace) -> int:
    if ns.action == "list":
        for name in profiles.list_profiles():
            print(name)
    elif ns.action == "show":
        sys.stdout.write(knobs.to_yaml(profiles.load_profile(ns.name)))
    elif ns.action == "delete":
        profiles.delete_profile(ns.name)
    elif ns.action == "save":
        cfg = config_from(ns)
        path = profiles.save_profile(ns.name, cfg)
        print(path)
        if ns.remember_key and cfg.server.api_key:
            problem = profiles.remember_key(ns.name, cfg.server.api_key)
            if problem:
                print(f"quantdeck: warning: {problem}", file=sys.stderr)
    return 0


def register(add: AddCommand) -> None:
    sp = add("plan", cmd_plan, "predict memory split and KV cache of a launch, with advice")
    sp.epilog = (
        f"exit status: 0 when the launch fits, {DOES_NOT_FIT} when it does not (or the advice "
        "has an error; the plan is printed all the same), 2 for a bad model, option or file"
    )
    add_model_and_knobs(sp)
    add_device(sp)
    add_engine(sp, "the plan follows (its vLLM version's rules; its options checked)")
    sp.add_argument("--json", action="store_true")

    sp = add("command", cmd_command, "print the `vllm serve` command (or its --config YAML)")
    add_model_and_knobs(sp)
    how = sp.add_mutually_exclusive_group()
    how.add_argument("--yaml", action="store_true", help="print the YAML instead")
    how.add_argument(
        "--as-run",
        action="store_true",
        help="print the command `serve` runs for this launch (its launch plan: Quantdeck's "
        "launcher, every flag the server gets, the environment it adds), as the panel's Copy "
        "does; the values the start chooses (ports, the run folder) as placeholders",
    )
    add_engine(sp, "the command is for (its flags checked against that vLLM's own parser)")

    sp = add("profile", cmd_profile, "save, show, list or delete launch profiles")
    psub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    psub.add_parser("list", help="list saved profiles")
    for action in ("show", "delete"):
        pa = psub.add_parser(action, help=f"{action} a profile")
        pa.add_argument("name")
    pa = psub.add_parser("save", help="save a profile from a model and knobs (never the key)")
    pa.add_argument("name")
    pa.add_argument(
        "--remember-key",
        action="store_true",
        help="keep --api-key in the system keyring for this profile (never in the file)",
    )
    add_model_and_knobs(pa)
