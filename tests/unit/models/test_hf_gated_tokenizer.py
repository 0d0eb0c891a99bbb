"""A real gated hub model (``--hf-gated``): needs ``HF_TOKEN`` and network, fails without them.

Asked-for gated tests must not skip silently: a missing token or an unreachable hub is a
failure that says what to set. Run with:
    HF_TOKEN=... uv run --group test bash tests/run_unit.sh --hf-gated -k hf_gated
"""

from __future__ import annotations

import os

import pytest

GATED_MODEL = "meta-llama/Llama-3.2-1B"  # gated: the token's account must have accepted its licence


def require_hub_token() -> str:
    """``$HF_TOKEN``, or fail the test with what to set (never a skip)."""
    token = os.environ.get("HF_TOKEN", "").strip()
    if not token:
        pytest.fail(f"hf_gated test needs HF_TOKEN (a Hugging Face token whose account has access to "
                    f"{GATED_MODEL}) and network access to the hub; set it, or run without --hf-gated",
                    pytrace=False)
    return token


@pytest.mark.hf_gated
def test_gated_tokenizer_loads_and_round_trips_arithmetic():
    token = require_hub_token()
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(GATED_MODEL, token=token)
    except Exception as e:  # noqa: BLE001 -- no network, no access to the repo, bad token: all one message
        pytest.fail(f"could not load gated {GATED_MODEL} from the hub with HF_TOKEN (network? licence "
                    f"accepted for this token's account?): {e}", pytrace=False)
    ids = tokenizer("12+34=46")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+34=46"


def test_missing_token_is_a_failure_not_a_skip(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(pytest.fail.Exception, match="needs HF_TOKEN .* and network access"):
        require_hub_token()
