"""Recorded rollouts (``posttrain.algorithms.rollout_recording``): a step written reads back as it was, bit
for bit, and anything that is not a recording of this run's shape is refused in one line naming
the file (the loop's record and replay: ``tests/integration/test_rollout_recording.py``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from unit.rollouts.rollout_helpers import make_group

from posttrain.algorithms import rollout_recording as recording
from posttrain.errors import DataError
from posttrain.rollouts.samples import RolloutSample

P, G = 2, 4


def step_samples(step: int) -> list[RolloutSample]:
    samples = [s for g in range(P) for s in make_group((step - 1) * P + g, size=G, first_id=(step - 1) * P * G + g * G)]
    for s in samples:
        s["question"], s["batch_index"] = f"{s['answer']} + 0 = ?", step
        s["completion_ids"] = s["completion_ids"][:2]
        s["seq_len"] = len(s["prompt_ids"]) + len(s["completion_ids"])
        # float32 values a JSON writer could round: they must read back bit for bit
        s["generation_logprobs"] = [struct.unpack("f", struct.pack("f", -1 / 3 - s["sample_id"] / 7))[0], -1e-8]
    return samples


def test_a_step_reads_back_bit_for_bit_in_the_documented_format(tmp_path: Path) -> None:
    path = recording.save_step(tmp_path / "rec", 3, step_samples(3), G)
    assert path == tmp_path / "rec" / "step_000003.json"
    raw = json.loads(path.read_text())
    assert {k: raw[k] for k in ("format", "step", "num_prompts", "completions_per_prompt")} == {
        "format": "posttrain-rollouts/1", "step": 3, "num_prompts": P, "completions_per_prompt": G}
    assert recording.load_step(tmp_path / "rec", 3, P, G) == step_samples(3)
    assert [p.name for p in (tmp_path / "rec").iterdir()] == ["step_000003.json"]  # no temporary file left
    recording.save_step(tmp_path / "rec", 1, step_samples(1), G)
    assert recording.recorded_steps(tmp_path / "rec") == [1, 3] and recording.recorded_steps(tmp_path / "no") == []


def test_a_recording_missing_steps_is_refused_before_a_replay_starts(tmp_path: Path) -> None:
    recording.check_recording(tmp_path, range(1, 1))  # nothing asked, nothing missing
    with pytest.raises(DataError, match=r"^grpo.load_rollouts='.*' has no recording of step\(s\) 1-3: it holds "
                                        r"no step_<N>.json file$"):
        recording.check_recording(tmp_path, range(1, 4))
    for step in (1, 2, 4):
        recording.save_step(tmp_path, step, step_samples(step), G)
    with pytest.raises(DataError, match=r"step\(s\) 3, 5: it holds steps 1-4 \(3 files\)$"):
        recording.check_recording(tmp_path, range(1, 6))
    recording.check_recording(tmp_path, range(1, 3))


def _write(tmp_path: Path, record: object) -> None:
    recording.step_file(tmp_path, 1).write_text(json.dumps(record))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.update(format="posttrain-rollouts/0"),
     r"is not a posttrain-rollouts/1 file \(format: 'posttrain-rollouts/0'\)"),
    (lambda r: r.update(step=2), r"records step 2, not 1"),
    (lambda r: r.update(completions_per_prompt=8, num_prompts=1), r"was recorded with num_prompts_per_step=1, "
                                                                  r"completions_per_prompt=8; this run has 2, 4"),
    (lambda r: r["samples"].pop(), r"holds 7 samples, not P \* G = 8"),
    # more samples than the header promises, in whole groups or one: never replayed
    (lambda r: r["samples"].extend(json.loads(json.dumps(r["samples"][-G:]))), r"holds 12 samples, not P \* G = 8"),
    (lambda r: r["samples"].append(dict(r["samples"][-1])), r"holds 9 samples, not P \* G = 8"),
    # a sample's own counts, both ways: one logprob per completion token, seq_len = prompt + completion
    (lambda r: r["samples"][4]["generation_logprobs"].append(-0.5),
     r"sample 4: 3 generation_logprobs for 2 completion tokens \(one per token\)"),
    (lambda r: r["samples"][4]["generation_logprobs"].pop(), r"sample 4: 1 generation_logprobs for 2 completion"),
    (lambda r: r["samples"][6]["completion_ids"].append(7), r"sample 6: 2 generation_logprobs for 3 completion"),
    (lambda r: r["samples"][1].update(seq_len=6), r"sample 1: seq_len=6, but it holds 5 prompt \+ completion tokens"),
    (lambda r: r["samples"][1].update(seq_len=4), r"sample 1: seq_len=4, but it holds 5 prompt"),
    (lambda r: r["samples"][5].pop("reward"), r"sample 5: not a RolloutSample \(fields differ: \['reward'\]\)"),
    (lambda r: r["samples"][2].update(weight_version=True), r"sample 2: weight_version=True is not int"),
    (lambda r: r["samples"][0].update(prompt_ids="1 2 3"), r"sample 0: prompt_ids='1 2 3' is not list"),
    (lambda r: r["samples"][3].update(group_id=1), r"samples 0-3 are not one group \(group_id \[0, 1\]\)"),
])
def test_anything_but_a_recording_of_this_runs_shape_is_one_line_naming_the_file(tmp_path: Path, edit,
                                                                                 message: str) -> None:
    record = json.loads(recording.save_step(tmp_path, 1, step_samples(1), G).read_text())
    edit(record)
    _write(tmp_path, record)
    with pytest.raises(DataError, match=f"^grpo.load_rollouts: {tmp_path}/step_000001.json.*{message}") as err:
        recording.load_step(tmp_path, 1, P, G)
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_a_missing_or_unreadable_step_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^grpo.load_rollouts: no recording of step 1 \(.*step_000001.json does not"):
        recording.load_step(tmp_path, 1, P, G)
    recording.step_file(tmp_path, 1).write_text('{"format": "posttrain-rollouts/1", "ste')
    with pytest.raises(DataError, match=r"step_000001.json is not readable JSON: ") as err:
        recording.load_step(tmp_path, 1, P, G)
    assert "\n" not in str(err.value)
    _write(tmp_path, [1, 2])
    with pytest.raises(DataError, match=r"is not a posttrain-rollouts/1 file \(format: 'list'\)"):
        recording.load_step(tmp_path, 1, P, G)


def test_only_whole_groups_are_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step 1: 7 samples are not whole groups of 4"):
        recording.save_step(tmp_path, 1, step_samples(1)[:7], G)
    assert not recording.step_file(tmp_path, 1).exists()


def test_a_replayed_prompt_must_be_this_runs_prompt_of_its_question_token_for_token(tmp_path: Path) -> None:
    """``prompt_of`` (the run's ``ChatEncoder.prompt``) decides: the same number of tokens is not enough."""
    record = json.loads(recording.save_step(tmp_path, 1, step_samples(1), G).read_text())
    prompt_of = {s["question"]: s["prompt_ids"] for s in step_samples(1)}.__getitem__
    assert recording.load_step(tmp_path, 1, P, G, prompt_of) == step_samples(1)
    for edit, message in [
        ([1, 2, 4], r"sample 5: its prompt_ids are not this run's prompt of its question \(from token 2: "
                    r"\[4\] recorded, \[3\] here; recorded with another tokenizer or chat template\?\)$"),  # as long
        ([1, 2, 3, 4], r"sample 5: .* \(from token 3: \[4\] recorded, \[\] here"),
        ([1, 2], r"sample 5: .* \(from token 2: \[\] recorded, \[3\] here"),
    ]:
        record["samples"][5] |= {"prompt_ids": edit, "seq_len": len(edit) + len(record["samples"][5]["completion_ids"])}
        _write(tmp_path, record)
        with pytest.raises(DataError, match=message):
            recording.load_step(tmp_path, 1, P, G, prompt_of)


def test_the_recorded_counts_are_json_integers(tmp_path: Path) -> None:
    text = recording.save_step(tmp_path, 3, step_samples(3), G).read_text()
    raw = json.loads(text)
    assert [type(raw[k]) for k in ("step", "num_prompts", "completions_per_prompt")] == [int, int, int]
    assert f'"num_prompts": {P},' in text  # 2, not 2.0


def test_a_recording_directory_is_made_with_its_parents(tmp_path: Path) -> None:
    path = recording.save_step(tmp_path / "runs" / "a" / "rollouts", 1, step_samples(1), G)
    assert path == tmp_path / "runs" / "a" / "rollouts" / "step_000001.json"
    assert recording.load_step(path.parent, 1, P, G) == step_samples(1)


@pytest.mark.parametrize(("held", "asked", "missing"), [
    ([1, 2, 4], range(1, 5), "step(s) 3: "),
    ([1], range(1, 12, 2), "step(s) 3, 5, 7, 9, 11: "),  # five, not a span: all of them
    ([1], range(1, 14, 2), "step(s) 3, 5, 7, 9, 11 ...: "),  # six: the first five
])
def test_the_missing_steps_are_one_step_a_span_or_the_first_five(tmp_path: Path, held, asked, missing) -> None:
    for step in held:
        recording.save_step(tmp_path, step, step_samples(step), G)
    with pytest.raises(DataError) as err:
        recording.check_recording(tmp_path, asked)
    assert f"has no recording of {missing}it holds" in str(err.value)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.update(samples=8), r"holds int samples, not P \* G = 8$"),
    (lambda r: r["samples"].__setitem__(6, 5), r"sample 6: not a RolloutSample \(fields differ: int\)$"),
    (lambda r: r["samples"][1].update(reward="1.0"), r"sample 1: reward='1.0' is not a number$"),
])
def test_what_is_not_a_list_a_sample_or_a_number_is_named_by_its_type(tmp_path: Path, edit, message: str) -> None:
    record = json.loads(recording.save_step(tmp_path, 1, step_samples(1), G).read_text())
    edit(record)
    _write(tmp_path, record)
    with pytest.raises(DataError, match=message):
        recording.load_step(tmp_path, 1, P, G)


def test_a_prompt_differing_from_its_first_token_is_named_with_the_file_and_five_tokens_each_side(tmp_path: Path):
    """The whole line: the file, the sample, the first differing token (0 here) and the next five tokens of each."""
    record = json.loads(recording.save_step(tmp_path, 1, step_samples(1), G).read_text())
    first = record["samples"][0]
    first |= {"prompt_ids": [11, 12, 13, 14, 15, 16, 17], "seq_len": 7 + len(first["completion_ids"])}
    _write(tmp_path, record)
    here = {first["question"]: [21, 22, 23, 24, 25, 26, 27]}
    with pytest.raises(DataError) as err:
        recording.load_step(tmp_path, 1, P, G, lambda q: here.get(q) or next(
            s["prompt_ids"] for s in step_samples(1) if s["question"] == q))
    assert str(err.value) == (f"grpo.load_rollouts: {recording.step_file(tmp_path, 1)}, sample 0: its prompt_ids are "
                              "not this run's prompt of its question (from token 0: [11, 12, 13, 14, 15] recorded, "
                              "[21, 22, 23, 24, 25] here; recorded with another tokenizer or chat template?)")
