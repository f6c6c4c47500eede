"""Quantdeck's core: plain Python, no Qt, no torch, no vLLM.

Packaged by job, each package naming its public API in its ``__init__``:

- :mod:`~quantdeck.core.launch`: the settings schema, profiles, device, planner, advisor;
- :mod:`~quantdeck.core.models`: the inspector, the library, the demo model;
- :mod:`~quantdeck.core.engines`: the interpreters with vLLM: each one's check, the registry;
- :mod:`~quantdeck.core.runtime`: the engine (which vLLM), the server subprocess, chat;
- :mod:`~quantdeck.core.doctor`: what this machine and each engine can do (``quantdeck doctor``);
- :mod:`~quantdeck.core.monitor`: metrics, telemetry, histories, recordings;
- :mod:`~quantdeck.core.bench`: load, datasets, statistics, client, A/B, tuning, runs;
- :mod:`~quantdeck.core.convert`: conversion jobs;
- :mod:`~quantdeck.core.workers`: the subprocess entry points, the only code that imports
  torch, vLLM or the conversion libraries.

Shared by all of them: :mod:`~quantdeck.core.errors`, :mod:`~quantdeck.core.paths` (user folders,
atomic writes), :mod:`~quantdeck.core.procs` (subprocess environment, reading the workers' lines)
and :mod:`~quantdeck.core.http`.
"""
