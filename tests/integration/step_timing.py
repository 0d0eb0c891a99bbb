"""Each step's timing and count metrics measure that step alone, judged on a recorded in-process run.

A per-step metric read from a running total (a phase timer that is never reset, a start time read
once before the loop, the producer's sampling seconds not differenced, a count of every sample
ever put) still looks like seconds or a count, and passes every structural rule (``> 0``,
finite), while it grows with the run. The bounds below hold for any honest step under any load,
because the intervals nest (``time.perf_counter`` throughout, the loops' own clock):

- the phases of step k (``timing/<phase>``) are disjoint parts of the step:
  ``sum(phases) <= timing/step``;
- step k begins after the loop logged step k - 1 and ends before it logs step k:
  ``timing/step <= logged_at[k] - logged_at[k - 1]`` (``in_process.Recorder.logged_at``);
- the asynchronous producer's sampling counted at step k ran after it was resumed at step k - 1
  and before it was paused at step k (both recorded actor calls): ``async/overlap_seconds``, the
  part of it the trainer did not wait for, is at most that span;
- the rollout buffer never holds more than ``max_staleness`` steps ahead of the claimed one.

A run whose first call of some kind is held ``DELAY_S`` (:func:`hold_first`) makes a running total
show: step 1's seconds leak into step 2 and exceed what step 2 has room for, whatever the load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

DELAY_S = 0.2
# the phases each loop times (``timer.time(...)``); a timing/* key outside them and timing/step
# must be added here, classified as a phase of the step or not
PHASES = {
    "grpo": {"generation", "reward", "advantages", "logprobs", "train", "refit", "validation"},
    "async": {"generation", "advantages", "logprobs", "train", "refit", "validation"},
    "sft": {"data", "train", "validation"},
}


def hold_first(seconds: float = DELAY_S, only: Callable[[Any], bool] = lambda call: True) -> Callable:
    """An ``in_process`` transform that holds the first call it sees (of those ``only`` accepts)
    ``seconds`` before handing its result back, inside the call."""
    held: list[bool] = []

    def transform(call: Any, result: Any) -> Any:
        if not held and only(call):
            held.append(True)
            time.sleep(seconds)
        return result

    return transform


def at(run: Any, key: str, step: int) -> float:
    return run.metrics[key][str(step)]


def assert_each_step_timed_alone(run: Any, loop: str) -> None:
    """Every logged step: its timing/* keys are ``PHASES[loop]`` and timing/step, the phases add up
    to at most the step, and the step to at most the time between its log and the previous one."""
    logged_at = run.recorder.logged_at
    steps = sorted(int(s) for s in run.metrics["timing/step"])
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2, steps
    for k in steps:
        timings = {key.removeprefix("timing/"): v[str(k)] for key, v in run.metrics.items()
                   if key.startswith("timing/") and str(k) in v}
        step = timings.pop("step")
        assert set(timings) <= PHASES[loop], (k, sorted(set(timings) - PHASES[loop]))
        assert 0 < sum(timings.values()) <= step, (k, timings, step)
        room = logged_at[k] - logged_at.get(k - 1, run.started)
        assert step <= room, f"step {k}: timing/step {step:.3f} s, but {room:.3f} s passed between its log and the last"


def assert_async_counts_are_per_step(run: Any) -> None:
    """``async/overlap_seconds`` within the producer's sampling span of each step, and
    ``async/buffer_size`` within what ``max_staleness`` lets the producer hold ahead."""
    acfg, grpo_cfg = run.cfg.grpo.async_, run.cfg.grpo
    calls = [c for c in run.recorder.actor_calls if c.actor == "RolloutProducer"]
    pauses = [c for c in calls if c.method == "pause"]
    resumes = [c for c in calls if c.method == "resume"]
    sampling_from = [next(c for c in calls if c.method == "start"), *resumes]  # when each step's sampling may begin
    steps = sorted(int(s) for s in run.metrics["async/overlap_seconds"])
    assert len(pauses) == len(steps), (len(pauses), steps)
    ahead = acfg.max_staleness * grpo_cfg.num_prompts_per_step * grpo_cfg.completions_per_prompt
    for k in steps:
        span = pauses[k - 1].ended - sampling_from[k - 1].started
        overlap = at(run, "async/overlap_seconds", k)
        assert 0 <= overlap <= span, f"step {k}: overlap {overlap:.3f} s, but the producer sampled for {span:.3f} s"
        assert 0 <= at(run, "async/buffer_size", k) <= ahead, (k, at(run, "async/buffer_size", k), ahead)
