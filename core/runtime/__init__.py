"""The engine at run time: which vLLM runs, the server subprocess and its log, the chat client,
LoRA adapters on a running server. (The registry of engines is :mod:`quantdeck.core.engines`.)"""

from quantdeck.core.runtime import lora
from quantdeck.core.runtime.chat import curl_command, request_of, stream
from quantdeck.core.runtime.engine import EngineEnv
from quantdeck.core.runtime.server import AttachedServer, ServerProcess, free_port, warm_up
from quantdeck.core.runtime.server_log import START_ORDER

__all__ = [
    "AttachedServer",
    "EngineEnv",
    "free_port",
    "lora",
    "ServerProcess",
    "START_ORDER",
    "stream",
    "curl_command",
    "request_of",
    "warm_up",
]
