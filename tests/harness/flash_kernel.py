"""Counting the calls of torch's flash varlen kernel, as ``models.packed_attention`` makes them."""

from __future__ import annotations

import functools

import pytest


def count_flash_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at every call of torch's flash varlen kernel through
    ``models.packed_attention`` for the rest of the test; skips the test where this torch has no
    such kernel (torch < 2.9)."""
    from posttrain.models import packed_attention

    kernel = packed_attention._flash_varlen()
    if kernel is None:
        pytest.skip("torch's flash varlen kernel (torch >= 2.9) is not in this torch")
    calls: list[int] = []

    @functools.wraps(kernel)  # the same signature: packed_attention reads the kernel's keywords from it
    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(packed_attention, "_flash_varlen", lambda: counted)
    return calls
