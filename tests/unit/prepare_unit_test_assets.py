"""Build the tiny models and tokenizers the tests use into the cache, once.

    uv run python tests/unit/prepare_unit_test_assets.py [--cache-dir DIR]

The cache is ``$POSTTRAIN_CACHE`` (default ``~/.cache/posttrain``), keyed by each config's
fingerprint, so a build is reused by every later session and by Ray workers; nothing is
downloaded. Tests do not need this run first: the ``tiny_model_path`` fixture calls
:func:`tiny_model_path`, which builds a missing asset on first use. Run it ahead to take
the build out of the first test's time (e.g. when baking a container image).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# name -> the TinyModelConfig fields; the default config is the one the unit tests share.
ASSETS: dict[str, dict] = {
    "arithmetic": {},
    "ascii": {"charset": "ascii"},
}


def tiny_model_path(name: str = "arithmetic", cache_dir: Path | None = None) -> Path:
    """Directory of the tiny model + tokenizer ``name`` (built now if the cache lacks it).

    Raises:
        KeyError: ``name`` is not in ``ASSETS`` (the known names are listed).
    """
    from posttrain.models.tiny import TinyModelConfig, build_tiny_model

    if name not in ASSETS:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(ASSETS)}")
    return build_tiny_model(TinyModelConfig(**ASSETS[name]), cache_dir)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $POSTTRAIN_CACHE or ~/.cache/posttrain")
    args = parser.parse_args(argv)
    for name in ASSETS:
        print(f"{name}: {tiny_model_path(name, args.cache_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
