"""The rollout producer of asynchronous GRPO: a Ray actor that keeps sampling.

It samples step ``b``'s prompts (the same problems and sampling seed as the synchronous loop's
step ``b``) with the engine's current weights, judges the completions, and puts the whole
batch, as G-sample groups tagged with the engine's weight version, into the rollout buffer;
then step ``b + 1``. Two things hold it back:

* an allowance: it samples step ``b`` only while ``b <= trained + 1 + max_staleness``
  (``trained``: steps the trainer has finished and refit), so no batch is sampled by weights
  more than ``max_staleness`` versions behind the trainer that will train on it, and the
  buffer never holds more than ``(max_staleness + 1)`` batches;
* a pause: the trainer pauses it around a refit (and validation), which waits for the batch
  being sampled, so every batch is sampled by one weight version.

The producer runs in its own thread inside the actor (a threaded actor, so ``pause`` and
``resume`` are served while the thread samples). An error in the thread is kept and raised
by the next ``pause``/``check`` call, so it reaches the trainer as itself.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.grpo_step import generate_rollouts, score_rollouts, to_samples
from posttrain.config_reads import ReadsConfig
from posttrain.data.sampler import EpochSampler
from posttrain.data.types import MathProblem
from posttrain.errors import PosttrainError, ProducerError


class RolloutProducer(ReadsConfig):
    """Samples GRPO batches ``first_batch, first_batch + 1, ...`` into ``buffer``.

    Args:
        engine: the run's ``EngineGroup`` (its actor handles; the driver refits it).
        buffer: the ``RolloutBuffer`` actor (a transport ``Actor``).
        model_path: Hugging Face directory (for the tokenizer and chat template).
        problems: the training pool (the sampler draws from it as the synchronous loop does).
        cfg: the run's ``GRPOMasterConfig``.
        first_batch: the first step to sample for (``resumed_at + 1``).
    """

    def __init__(self, engine: Any, buffer: Any, model_path: str, problems: list[MathProblem], cfg: GRPOMasterConfig,
                 first_batch: int):
        from transformers import AutoTokenizer

        from posttrain.data.chat import ChatEncoder

        self.engine, self.buffer, self.cfg = engine, buffer, cfg
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.chat = ChatEncoder(self.tokenizer)
        self.sampler = EpochSampler(problems, cfg.grpo.num_prompts_per_step, cfg.grpo.seed)
        self.next_batch = first_batch
        self.allowed = first_batch + cfg.grpo.async_.max_staleness
        self.last_batch = cfg.grpo.num_steps
        self.paused = self.busy = self.stopped = False
        self.error: BaseException | None = None
        self.generation_seconds = 0.0  # spent sampling and scoring, summed (for the overlap metric)
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _may_sample(self) -> bool:
        return not self.paused and self.next_batch <= min(self.allowed, self.last_batch)

    def _run(self) -> None:
        batch = self.next_batch
        try:
            while True:
                with self.cond:
                    self.cond.wait_for(lambda: self.stopped or self._may_sample())
                    if self.stopped:
                        return
                    self.busy, batch = True, self.next_batch
                start = time.perf_counter()
                rollouts = generate_rollouts(self.engine, self.chat, self.sampler.batch(batch), self.cfg, batch)
                score_rollouts(self.tokenizer, rollouts)
                samples = to_samples(rollouts, batch, self.cfg.grpo.completions_per_prompt)
                with self.cond:  # sampled and tagged: a refit may come now (pause need not wait for the put)
                    self.generation_seconds += time.perf_counter() - start
                    self.busy = False
                    self.cond.notify_all()
                # The allowance keeps (k + 1) batches within buffer_size; a put that waits for room
                # waits for the trainer's next clear, never for a pause.
                self.buffer.call("put", samples, timeout_s=self.cfg.grpo.async_.claim_timeout_s)
                with self.cond:
                    self.next_batch = batch + 1
                    self.cond.notify_all()
        except BaseException as exc:  # kept for the trainer: raised by its next pause/check
            with self.cond:
                self.error, self.busy = self._one_line(exc, batch), False
                self.cond.notify_all()

    def check(self) -> float:
        """Raise the sampling thread's error, if it had one; else the seconds it has spent
        sampling so far."""
        with self.cond:
            if self.error is not None:
                raise self.error
            return self.generation_seconds

    def pause(self) -> float:
        """Stop sampling new batches and wait for the one being sampled to be done (its
        samples are tagged with the weights that drew them; its put may still be on its way).
        Returns what :meth:`check` returns (raises the thread's error)."""
        with self.cond:
            self.paused = True
            self.cond.wait_for(lambda: not self.busy)
        return self.check()

    def resume(self, trained: int) -> None:
        """Sample again, up to step ``trained + 1 + max_staleness``.

        Args:
            trained: steps the trainer has finished (and whose weights the engine now holds).
        """
        with self.cond:
            self.paused = False
            self.allowed = trained + 1 + self.cfg.grpo.async_.max_staleness
            self.cond.notify_all()

    def stop(self) -> None:
        """Let the sampling thread end after the batch in flight (if any); returns at once (a
        thread waiting on a put ends when the buffer ends)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def _one_line(self, exc: BaseException, batch: int) -> PosttrainError:
        """``exc`` as one line that says which step's batch failed (a PosttrainError keeps its type)."""
        where = f"the rollout producer, sampling step {batch} (allowed up to step {self.allowed})"
        if isinstance(exc, PosttrainError):
            return type(exc)(f"{where}: {exc}".splitlines()[0])
        text = str(exc).strip().splitlines()
        return ProducerError(f"{where} failed: {type(exc).__name__}: {text[0] if text else ''}")
