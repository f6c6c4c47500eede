"""Launch planning: the settings schema and its walker, profiles, the device, the memory planner,
the advisor, and the launch plan (the server's command line and environment, made once)."""

from quantdeck.core.launch.advisor import Finding, advise, errors
from quantdeck.core.launch.command import LaunchPlan, launch_plan
from quantdeck.core.launch.config import GROUPS, LaunchConfig
from quantdeck.core.launch.device import DeviceFacts, GiB, cpu_device, cuda_device, detect_device
from quantdeck.core.launch.knobs import (
    MASK,
    Knob,
    check_value,
    command_line,
    for_engine,
    from_yaml,
    iter_knobs,
    parse_text,
    serve_command,
    to_dict,
    to_yaml,
    validate,
    vllm_args,
    vllm_env,
)
from quantdeck.core.launch.migrate import fit_to_engine
from quantdeck.core.launch.planner import (
    CPU_DEFAULT_KV_BYTES,
    EngineCheck,
    KvPlan,
    cpu_default_kv,
    engine_checks,
    local_vllm_version,
    plan,
    with_cpu_default_kv,
)
from quantdeck.core.launch.ray import RayFacts, probe_ray, uses_ray, with_ray

__all__ = [
    "local_vllm_version",
    "advise",
    "check_value",
    "command_line",
    "CPU_DEFAULT_KV_BYTES",
    "cpu_default_kv",
    "cpu_device",
    "cuda_device",
    "detect_device",
    "DeviceFacts",
    "EngineCheck",
    "fit_to_engine",
    "for_engine",
    "engine_checks",
    "errors",
    "Finding",
    "from_yaml",
    "GiB",
    "GROUPS",
    "iter_knobs",
    "Knob",
    "KvPlan",
    "LaunchConfig",
    "launch_plan",
    "LaunchPlan",
    "MASK",
    "parse_text",
    "plan",
    "probe_ray",
    "RayFacts",
    "serve_command",
    "to_dict",
    "to_yaml",
    "uses_ray",
    "validate",
    "vllm_args",
    "vllm_env",
    "with_cpu_default_kv",
    "with_ray",
]
