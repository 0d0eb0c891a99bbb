"""A recording every parity test trains from: a real run's rollouts (the tiny model's tokens and
logprobs, written by ``grpo.save_rollouts`` in this process), with the rewards rewritten so that
every group varies and every row trains, whatever the untrained model happened to answer
(every third sample of a step scores 1)."""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.algorithms import grpo
from posttrain.algorithms import rollout_recording as recording

GRPO_YAML = "examples/configs/grpo_arithmetic.yaml"


def record_varied_rollouts(root: Path, overrides: list[str], steps: int = 2) -> Path:
    """Run ``steps`` GRPO steps in-process with ``overrides``, recording into ``root/rollouts``,
    rewrite the rewards; returns the recording's directory."""
    from in_process import InProcess

    InProcess().run(grpo, GRPO_YAML, [*overrides, f"grpo.num_steps={steps}", f"grpo.save_rollouts={root / 'rollouts'}",
                                      f"logger.log_dir={root / 'log'}"])
    for step in range(1, steps + 1):
        path = recording.step_file(root / "rollouts", step)
        record = json.loads(path.read_text())
        for i, sample in enumerate(record["samples"]):
            sample["reward"] = float(i % 3 == 0)
        path.write_text(json.dumps(record))
    return root / "rollouts"
