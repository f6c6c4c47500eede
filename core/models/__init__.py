"""Models: the inspector (config.json and safetensors headers), the library, the built-in demo
model, LoRA adapters, the formats a conversion writes."""

from quantdeck.core.models.adapters import AdapterInfo, make_demo_adapter, read_adapter
from quantdeck.core.models.demo import default_demo_dir, ensure_demo_model, is_complete
from quantdeck.core.models.formats import CONVERSION_METHODS, ConversionMethod
from quantdeck.core.models.info import ModelInfo, inspect_model
from quantdeck.core.models.library import scan_folders, scan_hf_cache, scan_library

__all__ = [
    "AdapterInfo",
    "CONVERSION_METHODS",
    "ConversionMethod",
    "default_demo_dir",
    "ensure_demo_model",
    "inspect_model",
    "is_complete",
    "make_demo_adapter",
    "ModelInfo",
    "read_adapter",
    "scan_folders",
    "scan_hf_cache",
    "scan_library",
]
