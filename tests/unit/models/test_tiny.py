"""Tests for posttrain.models.tiny: the locally built, deterministic tokenizer and model.

Every CPU test that trains or generates starts from these builds, so they must be
byte-for-byte reproducible, cached, and loadable by the stock Hugging Face loaders.
"""

import hashlib
from pathlib import Path

import pytest
import torch

from posttrain.models.tiny import CHAT_TEMPLATE, TinyModelConfig, build_tiny_model, build_tokenizer, fingerprint


def _file_hashes(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _mtimes(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The default config built in two cache dirs, and a seed-1 config in the first."""
    cache_a = tmp_path_factory.mktemp("cache_a")
    cache_b = tmp_path_factory.mktemp("cache_b")
    return {
        "cache_a": cache_a,
        "a": build_tiny_model(TinyModelConfig(), cache_a),
        "b": build_tiny_model(TinyModelConfig(), cache_b),
        "seed1": build_tiny_model(TinyModelConfig(seed=1), cache_a),
    }


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("arithmetic")


def test_build_writes_a_hugging_face_directory(builds: dict[str, Path]) -> None:
    path = builds["a"]
    assert path == builds["cache_a"] / "tiny" / fingerprint(TinyModelConfig())
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    # no temporary build directory is left behind
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".build-")]


def test_same_config_gives_identical_bytes_in_two_cache_dirs(builds: dict[str, Path]) -> None:
    assert builds["a"] != builds["b"]
    assert builds["a"].name == builds["b"].name  # same fingerprint
    hashes_a, hashes_b = _file_hashes(builds["a"]), _file_hashes(builds["b"])
    assert "model.safetensors" in hashes_a
    assert hashes_a == hashes_b


def test_other_seed_gives_other_weights_and_path(builds: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    assert builds["seed1"] != builds["a"]
    w0 = load_file(builds["a"] / "model.safetensors")
    w1 = load_file(builds["seed1"] / "model.safetensors")
    assert w0.keys() == w1.keys()
    differing = [k for k in w0 if not torch.equal(w0[k], w1[k])]
    assert "model.embed_tokens.weight" in differing
    # the tokenizer does not depend on the seed
    assert _file_hashes(builds["a"])["tokenizer.json"] == _file_hashes(builds["seed1"])["tokenizer.json"]


def test_fingerprint_depends_on_every_field() -> None:
    base = TinyModelConfig()
    variants = [TinyModelConfig(seed=1), TinyModelConfig(hidden_size=64), TinyModelConfig(charset="ascii"),
                TinyModelConfig(num_hidden_layers=2), TinyModelConfig(max_position_embeddings=512)]
    prints = {fingerprint(base), *(fingerprint(v) for v in variants)}
    assert len(prints) == 1 + len(variants)
    assert fingerprint(TinyModelConfig()) == fingerprint(base)


def test_cache_is_reused_without_rewriting(builds: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import posttrain.models.tiny as tiny

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a cached model was built again")

    monkeypatch.setattr(tiny, "build_model", no_rebuild)
    monkeypatch.setattr(tiny, "build_tokenizer", no_rebuild)
    before = _mtimes(builds["a"])
    hashes = _file_hashes(builds["a"])
    again = build_tiny_model(TinyModelConfig(), builds["cache_a"])
    assert again == builds["a"]
    assert _mtimes(builds["a"]) == before
    assert _file_hashes(builds["a"]) == hashes
    siblings = sorted(p.name for p in builds["a"].parent.iterdir())
    assert siblings == sorted([builds["a"].name, builds["seed1"].name])


def test_tokenizer_round_trips_arithmetic(tokenizer) -> None:
    text = "12+34=46"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.decode(ids) == text
    # digits are distinct tokens, repeated characters map to the same id
    assert ids[4] == ids[6]  # both '4'
    assert len(set(ids)) == len(set(text))
    assert ids[0] == tokenizer("1", add_special_tokens=False)["input_ids"][0]


def test_arithmetic_vocabulary(tokenizer) -> None:
    assert tokenizer.pad_token_id == 0 and tokenizer.pad_token == "<pad>"
    assert tokenizer.eos_token_id == 1 and tokenizer.eos_token == "<eos>"
    assert len(tokenizer) == 17  # 15 characters + pad + eos
    ids = [tokenizer(ch, add_special_tokens=False)["input_ids"] for ch in "0123456789+-*= "]
    assert all(len(i) == 1 for i in ids)
    assert sorted(i[0] for i in ids) == list(range(2, 17))


def test_saved_tokenizer_loads_with_auto_tokenizer_and_gives_the_same_ids(builds: dict[str, Path], tokenizer) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(builds["a"])
    for text in ["12+34=46", "0", "99*99=9801", "7 - 3 = 4"]:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"], text
        assert loaded.decode(loaded(text)["input_ids"]) == text
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 1
    assert len(loaded) == len(tokenizer)
    assert loaded.chat_template == CHAT_TEMPLATE


def test_chat_template_renders_prompt_response_eos(tokenizer) -> None:
    messages = [{"role": "user", "content": "12+34="}, {"role": "assistant", "content": "46"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "12+34=46<eos>"
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "12+34="
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert list(ids) == tokenizer("12+34=46", add_special_tokens=False)["input_ids"] + [1]


def test_ascii_charset_tokenizes_spaces_and_newlines() -> None:
    tok = build_tokenizer("ascii")
    text = "Hi there,\n 3!"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    space, newline = (tok(c, add_special_tokens=False)["input_ids"] for c in (" ", "\n"))
    assert len(space) == len(newline) == 1 and space != newline
    assert len(tok) == 2 + 256  # every byte has a token


def test_ascii_charset_covers_non_ascii_text_as_bytes() -> None:
    tok = build_tokenizer("ascii")
    text = "café 5€"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())
    assert tok.decode(ids) == text


def test_unknown_charset_raises() -> None:
    with pytest.raises(KeyError):
        build_tokenizer("klingon")


def test_saved_model_runs_a_forward_pass(builds: dict[str, Path], tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(builds["a"])
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.pad_token_id == 0 and model.config.eos_token_id == 1
    ids = torch.tensor([tokenizer("12+34=46")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert logits.std() > 0  # not a degenerate constant output


def test_default_parameter_count(builds: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(builds["a"])
    count = sum(p.numel() for p in model.parameters())
    assert 0.4e6 <= count <= 0.8e6, count
