"""Tiny, deterministic, locally built tokenizer + Qwen2-architecture causal LM.

Nothing here touches a model hub: the tokenizer is character level (one token per
character of a fixed charset, plus ``<pad>`` and ``<eos>``) and the model weights come
from ``torch.manual_seed(seed)``. ``build_tiny_model`` saves both in Hugging Face format to a
cache directory keyed by a hash of the config, so the same config always gives the same
bytes and the same path, and any code that loads a Hugging Face model directory
(``AutoModelForCausalLM.from_pretrained``, vLLM) can load it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from posttrain.config import TinyModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PAD, EOS = "<pad>", "<eos>"
# Bump when the way a tokenizer or model is built changes: it invalidates cached builds.
RECIPE_VERSION = 1

# The character sets a tiny tokenizer can be built over.
CHARSETS: dict[str, str] = {
    # digits, the operators of the arithmetic task, '=' and a space: 15 symbols (+2 special)
    "arithmetic": "0123456789+-*= ",
    # every printable ASCII character (GSM8K text); other bytes get tokens too
    "ascii": "".join(c for c in string.printable if c not in "\x0b\x0c\r"),
}

# User turn verbatim, assistant turn followed by EOS. No role markers: the tiny model
# learns the format from data, and a prompt such as "12+34=" already cues the answer.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{ message['content'] }}{{ eos_token }}"
    "{%- else -%}{{ message['content'] }}{%- endif -%}"
    "{%- endfor -%}"
)


def fingerprint(cfg: TinyModelConfig) -> str:
    """Short hash of the config (and the tokenizer recipe): the cache key. It reads every field (a
    cached build is one of them all: ``posttrain.config_reads`` counts them read on a cache hit)."""
    fields = {name: getattr(cfg, name) for name in type(cfg).model_fields}  # what model_dump() gives
    recipe = [fields, RECIPE_VERSION, CHAT_TEMPLATE, CHARSETS[cfg.charset]]
    payload = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """``$POSTTRAIN_CACHE`` or ``~/.cache/posttrain``."""
    return Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain"))


def _byte_level_alphabet() -> dict[int, str]:
    """Byte -> printable stand-in character, the byte-level BPE convention (GPT-2, Qwen2).

    Printable Latin-1 bytes stand for themselves; the rest are shifted to code points 256+,
    so a space is ``"\u0120"`` (``Ġ``) and a newline ``"\u010a"`` (``Ċ``).
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(charset: str):
    """Build a character-level ``Qwen2Tokenizer`` with a chat template.

    It is a byte-level BPE tokenizer with an empty merge list, so every byte is its own
    token: one token per character for ASCII text. Using the Qwen2 tokenizer class (rather
    than a generic one) matters: ``AutoTokenizer`` and vLLM pick the tokenizer class from the
    model type, and a Qwen2 model directory loads as a ``Qwen2Tokenizer``.

    Token ids: 0 ``<pad>``, 1 ``<eos>``, then the charset's characters in order; with the
    ``ascii`` charset every other byte follows too (non-ASCII text becomes several tokens).

    Raises:
        KeyError: unknown ``charset`` (the pydantic config rules this out for user input).
    """
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    alphabet = _byte_level_alphabet()
    vocab = {PAD: 0, EOS: 1}
    for ch in CHARSETS[charset]:
        vocab.setdefault(alphabet[ord(ch)], len(vocab))
    if charset == "ascii":
        for b in range(256):
            vocab.setdefault(alphabet[b], len(vocab))
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,  # type: ignore[arg-type]  # every character has a token; transformers types it str
        eos_token=EOS,
        pad_token=PAD,
        padding_side="right",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(cfg: TinyModelConfig, vocab_size: int, pad_id: int, eos_id: int) -> PreTrainedModel:
    """Build a randomly initialized ``Qwen2ForCausalLM`` from ``cfg.seed`` (fp32, CPU)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    return Qwen2ForCausalLM(config)


def build_tiny_model(cfg: TinyModelConfig, cache_dir: Path | None = None) -> Path:
    """Build (or reuse) the tiny tokenizer + model and return its Hugging Face directory.

    The directory is ``<cache_dir>/tiny/<fingerprint>``. It is written to a temporary
    sibling and renamed into place, so concurrent builders (parallel tests, Ray workers)
    never see a half-written model.

    Returns:
        Path of a directory loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM``.
    """
    target = (cache_dir or default_cache_dir()) / "tiny" / fingerprint(cfg)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        tokenizer = build_tokenizer(cfg.charset)
        model = build_model(cfg, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
