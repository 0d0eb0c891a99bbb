"""Rollouts recorded on disk and read back: ``grpo.save_rollouts=DIR`` writes each step's scored
rollouts, ``grpo.load_rollouts=DIR`` trains on them with no engine (train-only debugging, and the
input from which parallel layouts are compared on the same data).

Format ``posttrain-rollouts/1``: one JSON file per step, ``DIR/step_<N>.json`` (N zero-padded
to 6 digits)::

    {"format": "posttrain-rollouts/1", "step": N, "num_prompts": P, "completions_per_prompt": G,
     "samples": [sample, ...]}

``samples`` holds the step's P * G samples in the order they were sampled, the G completions of
a prompt contiguous. A sample is a :class:`~posttrain.rollouts.samples.RolloutSample`: its tags
(``sample_id``, ``group_id``, ``weight_version`` of the weights that sampled it, ``seq_len``,
``batch_index`` = N), token ids (``prompt_ids``, ``completion_ids``, unpadded), the engine's
``generation_logprobs`` (behaviour policy, one per completion token, at the sampling
temperature), the verifier's ``reward`` (1.0 / 0.0) and the problem (``question``, ``answer``).
Floats are JSON numbers in Python's shortest round-trip form, so a float32 logprob reads back
bit for bit. Each file is written whole (a temporary file renamed into place): a run killed
mid-write leaves no half file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.data.chat import first_difference
from posttrain.errors import DataError
from posttrain.rollouts.samples import RolloutSample

FORMAT = "posttrain-rollouts/1"
_STEP_FILE = re.compile(r"step_(\d{6})\.json")
# The JSON type of each field of a sample (bool is not an int here: a flag is never a count).
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "sample_id": int, "group_id": int, "weight_version": int, "seq_len": int, "batch_index": int,
    "prompt_ids": list, "completion_ids": list, "generation_logprobs": list, "reward": (int, float),
    "question": str, "answer": str,
}
assert set(_FIELDS) == set(RolloutSample.__annotations__), "the format lists every field of a sample"


def step_file(root: str | Path, step: int) -> Path:
    """``root/step_<step, 6 digits>.json``."""
    return Path(root) / f"step_{step:06d}.json"


def recorded_steps(root: str | Path) -> list[int]:
    """The steps with a file in ``root``, ascending ([] when ``root`` does not exist)."""
    path = Path(root)
    if not path.is_dir():
        return []
    return sorted(int(m.group(1)) for f in path.iterdir() if (m := _STEP_FILE.fullmatch(f.name)))


def save_step(root: str | Path, step: int, samples: list[RolloutSample], completions_per_prompt: int) -> Path:
    """Write step ``step``'s samples (``P * G`` of them, groups contiguous) to ``root``; returns the file.

    Raises:
        ValueError: the samples are not whole groups of ``completions_per_prompt``.
    """
    if not samples or len(samples) % completions_per_prompt:
        raise ValueError(f"step {step}: {len(samples)} samples are not whole groups of {completions_per_prompt}")
    target = step_file(root, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "step": step, "num_prompts": len(samples) // completions_per_prompt,
              "completions_per_prompt": completions_per_prompt, "samples": [dict(s) for s in samples]}
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, target)
    return target


def check_recording(root: str | Path, steps: range) -> None:
    """Every step of ``steps`` has a file in ``root`` (checked before a replay starts anything).

    Raises:
        DataError: one line naming ``grpo.load_rollouts``, the directory, the missing steps and
            the ones it holds.
    """
    held = recorded_steps(root)
    missing = [s for s in steps if s not in set(held)]
    if missing:
        have = f"steps {held[0]}-{held[-1]} ({len(held)} files)" if held else "no step_<N>.json file"
        raise DataError(f"grpo.load_rollouts='{root}' has no recording of step(s) {_span(missing)}: it holds {have}")


def load_step(root: str | Path, step: int, num_prompts: int, completions_per_prompt: int,
              prompt_of: Callable[[str], Sequence[int]] | None = None) -> list[RolloutSample]:
    """Step ``step``'s samples, as recorded, checked against the format and this run's P and G, and
    with ``prompt_of`` (this run's ``ChatEncoder.prompt``) each sample's ``prompt_ids`` against the
    prompt this run renders for its question, token by token: a recording made with another
    tokenizer or chat template would train on prompts this run never samples from.

    Raises:
        DataError: no file, not JSON, another format or step, another P or G than this run's
            (advantages group by G: another G would mix groups), other than P * G samples (fewer or
            more), or a sample whose fields or their types are not a ``RolloutSample``'s, or whose
            ``seq_len`` or count of ``generation_logprobs`` disagrees with its tokens; one line
            naming the file; with ``prompt_of``, a sample whose prompt is not this run's prompt of its
            question (naming the first token that differs).
    """
    path = step_file(root, step)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"grpo.load_rollouts: no recording of step {step} ({path} does not exist)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"grpo.load_rollouts: {path} is not readable JSON: {exc}".splitlines()[0]) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise DataError(f"grpo.load_rollouts: {path} is not a {FORMAT} file (format: {found!r})")
    if record.get("step") != step:
        raise DataError(f"grpo.load_rollouts: {path} records step {record.get('step')!r}, not {step}")
    shape = (record.get("num_prompts"), record.get("completions_per_prompt"))
    if shape != (num_prompts, completions_per_prompt):
        raise DataError(f"grpo.load_rollouts: {path} was recorded with num_prompts_per_step={shape[0]}, "
                        f"completions_per_prompt={shape[1]}; this run has {num_prompts}, {completions_per_prompt}")
    samples = record.get("samples")
    if not isinstance(samples, list) or len(samples) != num_prompts * completions_per_prompt:
        count = len(samples) if isinstance(samples, list) else type(samples).__name__
        raise DataError(f"grpo.load_rollouts: {path} holds {count} samples, not P * G = "
                        f"{num_prompts * completions_per_prompt}")
    for i, sample in enumerate(samples):
        _check_sample(path, i, sample)
        if prompt_of is not None:
            _check_prompt(path, i, sample, prompt_of(sample["question"]))
    for first in range(0, len(samples), completions_per_prompt):
        ids = {s["group_id"] for s in samples[first:first + completions_per_prompt]}
        if len(ids) != 1:
            raise DataError(f"grpo.load_rollouts: {path}, samples {first}-{first + completions_per_prompt - 1} are "
                            f"not one group (group_id {sorted(ids)}): a prompt's G completions must be contiguous")
    return samples


def _check_sample(path: Path, i: int, sample: Any) -> None:
    if not isinstance(sample, dict) or set(sample) != set(_FIELDS):
        keys = sorted(set(sample) ^ set(_FIELDS)) if isinstance(sample, dict) else type(sample).__name__
        raise DataError(f"grpo.load_rollouts: {path}, sample {i}: not a RolloutSample (fields differ: {keys})")
    for key, kind in _FIELDS.items():
        if not isinstance(sample[key], kind) or isinstance(sample[key], bool):
            raise DataError(f"grpo.load_rollouts: {path}, sample {i}: {key}={sample[key]!r} is not "
                            f"{getattr(kind, '__name__', 'a number')}")
    # Counts the sample states about itself, held exactly (a logprob too many would be cut off unseen
    # by the train batch, which takes one per completion token)
    completion, logprobs = len(sample["completion_ids"]), len(sample["generation_logprobs"])
    if logprobs != completion:
        raise DataError(f"grpo.load_rollouts: {path}, sample {i}: {logprobs} generation_logprobs for "
                        f"{completion} completion tokens (one per token)")
    tokens = len(sample["prompt_ids"]) + completion
    if sample["seq_len"] != tokens:
        raise DataError(f"grpo.load_rollouts: {path}, sample {i}: seq_len={sample['seq_len']}, but it holds "
                        f"{tokens} prompt + completion tokens")


def _check_prompt(path: Path, i: int, sample: RolloutSample, prompt: Sequence[int]) -> None:
    recorded = sample["prompt_ids"]
    if list(recorded) != list(prompt):
        at = first_difference(recorded, prompt) or 0
        raise DataError(f"grpo.load_rollouts: {path}, sample {i}: its prompt_ids are not this run's prompt of its "
                        f"question (from token {at}: {recorded[at:at + 5]} recorded, {list(prompt[at:at + 5])} here; "
                        "recorded with another tokenizer or chat template?)")


def _span(steps: list[int]) -> str:
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}" if steps == list(
        range(steps[0], steps[-1] + 1)) else ", ".join(map(str, steps[:5])) + (" ..." if len(steps) > 5 else "")
