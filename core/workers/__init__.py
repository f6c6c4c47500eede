"""The subprocess entry points: the only modules that import torch, vLLM, transformers or the
conversion libraries. Each runs as ``python -m quantdeck.core.workers.NAME`` and speaks the
line protocol of :mod:`~quantdeck.core.workers.protocol`; nothing in the GUI process imports them.

- ``engine``: ``vllm serve`` (or any ``vllm`` command) in this interpreter, whatever its version;
- ``probe``: what the vLLM here is and accepts;
- ``quantize``: the conversion jobs (compressed-tensors, bitsandbytes, GPTQModel);
- ``quality``: KL, top-1 agreement and perplexity of a converted model against its source;
- ``demo_train``: the built-in demo model.
"""
