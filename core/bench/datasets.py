"""The prompts of a run: exact-length windows of English text, ``vllm bench serve``'s random
dataset prompt for prompt, or the user's JSONL / ShareGPT files."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from quantdeck.core.bench.load import LoadSpec, Request
from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.paths import CORPUS
from quantdeck.core.schema import Fields, load_json, read_bounded, shown


class _Tokenizer:
    """The server's own tokenizer, through vLLM's /tokenize and /detokenize routes."""

    def __init__(self, client: httpx.Client, model: str) -> None:
        self.client, self.model = client, model

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.client.post(path, json={"model": self.model, **body})
        if r.status_code == 404:
            raise ServerError(f"the server has no {path} route; give --prompts-file instead")
        if r.status_code != 200:
            raise ServerError(f"{path}: HTTP {r.status_code}: {r.text[:160]}")
        return r.json()

    def encode(self, text: str, special: bool) -> list[int]:
        """Token ids; a long text (the corpus) is asked in pieces of whole lines: a keyed
        server answers a keyless /tokenize (a router that does not hold its key forwards it
        so) of at most 64 KiB (core.workers.engine's open gate)."""
        ids: list[int] = []
        for k, piece in enumerate(_pieces(text, ENCODE_PIECE_BYTES)):
            body = {"prompt": piece, "add_special_tokens": special and k == 0}
            ids += self._post("/tokenize", body)["tokens"]
        return ids

    def count(self, text: str) -> int:
        return int(self._post("/tokenize", {"prompt": text})["count"])

    def decode(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", {"tokens": ids})["prompt"])


ENCODE_PIECE_BYTES = 32 * 2**10  # a /tokenize body's text, at most (half the open gate's floor)


def _pieces(text: str, max_bytes: int) -> list[str]:
    """``text`` in pieces of whole lines of at most ``max_bytes`` (UTF-8) each, but for a
    single longer line; one piece for a short text (an empty one too)."""
    if len(text.encode("utf-8")) <= max_bytes:
        return [text]
    pieces: list[str] = []
    piece: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode("utf-8"))
        if piece and size + n > max_bytes:
            pieces.append("".join(piece))
            piece, size = [], 0
        piece.append(line)
        size += n
    if piece:
        pieces.append("".join(piece))
    return pieces


def _corpus_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.txt")))


def exact_prompt(tok: _Tokenizer, source: list[int], length: int, rng: random.Random) -> Request:
    """Text that the server counts as exactly ``length`` prompt tokens (special tokens
    included), cut from ``source`` at a random place; token ids if text cannot hit it."""
    extra = tok.count("") if length > 1 else 0  # BOS and friends the server adds
    want = max(1, length - extra)
    start = rng.randrange(0, max(1, len(source) - want))
    n = want
    for _ in range(4):
        ids = (source * (1 + (start + n) // len(source)))[start : start + n]
        text = tok.decode(ids)
        got = tok.count(text)
        if got == length:
            return Request(text, length, 0)
        n = max(1, n + (length - got))
    ids = (source * (1 + (start + length) // len(source)))[start : start + length]
    return Request(ids, length, 0)  # token ids: exact by construction


MAX_TOKENIZER_BYTES = 64 * 2**20  # tokenizer.json: Llama 3's is 9 MB, Gemma 3's 33 MB
MAX_VOCAB = 2**22  # tokens in its vocabulary: the largest in use have about 260 000


def tokenizer_vocab(folder: str | Path) -> tuple[int, list[int]]:
    """What ``vllm bench serve``'s random dataset draws from: the tokenizer's base vocabulary
    size (``vocab_size``) and its ids less the special tokens, read from ``tokenizer.json``
    (no tokenizer library needed). The file is checked before it is read (a regular file of
    at most :data:`MAX_TOKENIZER_BYTES`: a FIFO or a device is refused, never waited on) and
    read with the schema check: any damage is one ConfigError line."""
    path = Path(folder) / "tokenizer.json"
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"{path}: not found; --dataset-name random needs the tokenizer's "
            "folder (--tokenizer PATH)"
        )
    raw = read_bounded(path, MAX_TOKENIZER_BYTES, "tokenizer.json")
    top = Fields(load_json(raw, str(path)), str(path))
    model = top.sub("model", required=True)
    assert model is not None  # required
    vocab = model.data.get("vocab")  # a dict (BPE, WordPiece) or a list (Unigram)
    if not isinstance(vocab, dict | list) or not vocab:
        model.fail(f"'vocab' must be a non-empty object or list of tokens, got {shown(vocab)}")
    if len(vocab) > MAX_VOCAB:
        model.fail(f"'vocab' has over {MAX_VOCAB} tokens")
    special: set[int] = set()
    for n, t in enumerate(top.items("added_tokens", max_len=MAX_VOCAB) or []):
        token = Fields(t, f"{path}: 'added_tokens' {n + 1}")
        token_id = token.integer("id", lo=0, required=True)
        if token.boolean("special"):
            special.add(int(token_id or 0))
    ids = [i for i in range(len(vocab)) if i not in special]
    if not ids:
        raise ConfigError(f"{path}: no ordinary tokens")
    return len(vocab), ids


def random_dataset(
    tok: _Tokenizer,
    vocab: tuple[int, list[int]],
    input_len: int,
    output_len: int,
    count: int,
    measured: int,
    seed: int,
) -> list[Request]:
    """``vllm bench serve --dataset-name random --seed SEED`` (range ratio 0, no prefix),
    prompt for prompt: request i is the text of ``allowed[(offset_i + i + k) % len(allowed)]``,
    k < input_len - special tokens, re-tokenized until it is that long (random ids appended
    or the tail cut, at most 10 times; like vLLM's, a prompt can stay a token or two off).
    The first ``measured`` are vLLM's requests; the rest (warm-ups) continue its generator."""
    vocab_size, allowed = vocab
    rng = np.random.default_rng(seed)
    special = tok.count("")  # the BOS and friends the server adds to text
    inner = input_len - special
    if inner < 1:
        raise ConfigError(
            f"--input-len {input_len} leaves no token next to the tokenizer's "
            f"{special} special one(s)"
        )

    def sample(n: int, first: int) -> list[Request]:
        if first == 0:  # vLLM draws the lengths, then the offsets
            rng.integers(inner, inner + 1, size=n)
            rng.integers(output_len, output_len + 1, size=n)
        offsets = rng.integers(0, vocab_size, size=n)
        out = []
        for j in range(n):
            i = first + j
            seq = [allowed[(int(offsets[j]) + i + k) % len(allowed)] for k in range(inner)]
            tries = 10
            while True:
                text = tok.decode(seq)
                seq = tok.encode(text, False)
                if tries <= 0 or len(seq) == inner:
                    break
                if len(seq) < inner:
                    seq += rng.integers(0, vocab_size, size=inner - len(seq)).tolist()
                else:
                    seq = seq[:inner]
                tries -= 1
            out.append(Request(text, input_len + len(seq) - inner, output_len))
        return out

    reqs = sample(min(count, measured), 0)
    if count > measured:
        reqs += sample(count - measured, measured)
    return reqs


def build_requests(
    spec: LoadSpec,
    tok: _Tokenizer | None,
    count: int,
    seed: int,
    vocab: tuple[int, list[int]] | None = None,
) -> list[Request]:
    """The first ``spec.num_prompts`` are measured, the rest warm-ups. ``vocab``: what
    ``dataset="random"`` draws from (:func:`tokenizer_vocab`)."""
    rng = random.Random(seed)
    if spec.prompts_file:
        rows = _read_jsonl(spec.prompts_file)
        reqs = []
        for i in range(count):
            row = rows[i % len(rows)]
            n = tok.count(row["prompt"]) if tok else 0
            reqs.append(Request(row["prompt"], n, int(row.get("output_len", spec.output_len))))
        return reqs
    if spec.sharegpt:
        pairs = _read_sharegpt(spec.sharegpt)
        rng.shuffle(pairs)
        reqs = []
        for i in range(count):
            human, reply = pairs[i % len(pairs)]
            n = tok.count(human) if tok else 0
            out = len(tok.encode(reply, False)) if tok else spec.output_len
            reqs.append(Request(human, n, max(1, out)))
        return reqs
    assert tok is not None
    if spec.dataset == "random":
        if not vocab:
            raise ConfigError("--dataset-name random needs the tokenizer's vocabulary")
        return random_dataset(
            tok, vocab, spec.input_len, spec.output_len, count, spec.num_prompts, seed
        )
    source = tok.encode(_corpus_text(), False)
    reqs = []
    for _ in range(count):
        r = exact_prompt(tok, source, spec.input_len, rng)
        r.output_len = spec.output_len
        reqs.append(r)
    return reqs


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = load_json(line, f"{path}:{n}: not a JSON line")
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ConfigError(f"{path}:{n}: expected an object with a 'prompt' string")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: no prompts")
    return rows


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    data = load_json(Path(path).read_bytes(), f"{path}: not JSON")
    pairs = []
    for item in data if isinstance(data, list) else []:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if isinstance(conv, list) and len(conv) >= 2:
            pairs.append((str(conv[0].get("value", "")), str(conv[1].get("value", ""))))
    pairs = [p for p in pairs if p[0] and p[1]]
    if not pairs:
        raise ConfigError(f"{path}: no ShareGPT conversations with a prompt and a reply")
    return pairs
