"""Tests for posttrain/testing/rules/completeness.py: ``--expect-steps`` decisions."""

from __future__ import annotations

from posttrain.testing.rules.checker import normalize
from posttrain.testing.rules.completeness import Completeness, check_completeness, last_logged_step, run_progress


def steps(*numbers: int) -> dict[str, float]:
    return {str(s): 0.5 for s in numbers}


RUN = normalize(
    {
        "train/loss": steps(*range(1, 201)),
        "val/accuracy": steps(0, 50, 100, 150, 200),
        "eval/score": 0.7,
    }
)
STOPPED = normalize({"train/loss": steps(*range(1, 61)), "val/accuracy": steps(0, 50)})


class TestLastLoggedStep:
    def test_over_all_or_some_metrics(self):
        assert last_logged_step(STOPPED) == 60
        assert last_logged_step(STOPPED, ["val/accuracy"]) == 50
        assert last_logged_step(STOPPED, ["absent"]) is None

    def test_plain_numbers_have_no_steps(self):
        assert last_logged_step(normalize({"eval/score": 0.7})) is None


class TestRunProgress:
    def test_complete_run_scans_only_what_the_rules_read(self):
        assert run_progress(RUN, ["val/accuracy"], 200) == 200

    def test_incomplete_reads_fall_back_to_the_whole_run(self):
        # the rules read only val/accuracy (last at 50); the run itself got to 60
        assert run_progress(STOPPED, ["val/accuracy"], 200) == 60


class TestCheckCompleteness:
    def test_complete(self):
        result = check_completeness(RUN, ["train/loss", "val/accuracy", "eval/score"], 200, 200)
        assert result.complete and result.message == ""

    def test_run_stopped_early_fails_every_rule(self):
        for reads in (["train/loss"], [], ["eval/score"]):
            result = check_completeness(STOPPED, reads, 200, 60)
            assert not result.complete
            assert result.message == "run stopped at step 60 of 200"

    def test_one_step_short_fails_and_exactly_n_passes(self):
        data = normalize({"train/loss": steps(*range(1, 200))})
        assert check_completeness(data, ["train/loss"], 200, 199).message == "run stopped at step 199 of 200"
        assert check_completeness(data, ["train/loss"], 199, 199).complete

    def test_metric_that_stops_early_in_a_complete_run(self):
        data = normalize({"train/loss": steps(*range(1, 201)), "train/kl": steps(*range(1, 101))})
        result = check_completeness(data, ["train/kl"], 200, 200)
        assert not result.complete and result.message == "'train/kl' stopped at step 100 of 200"
        assert check_completeness(data, ["train/loss"], 200, 200).complete

    def test_resumed_run_with_a_gap_that_reaches_the_end_is_complete(self):
        data = normalize({"train/loss": steps(*range(1, 6), *range(8, 201))})
        assert check_completeness(data, ["train/loss"], 200, 200).complete

    def test_steps_past_the_expected_end_are_allowed(self):
        data = normalize({"train/loss": steps(*range(1, 251))})
        assert check_completeness(data, ["train/loss"], 200, 250).complete

    def test_no_steps_at_all(self):
        result = check_completeness(normalize({"eval/score": 0.7}), ["eval/score"], 10, None)
        assert not result.complete and "no steps" in result.message


def test_a_run_whose_read_metrics_reach_the_end_is_judged_on_them_alone():
    # train/loss runs on past the expected end; the rules read only val/accuracy, which reaches it
    data = normalize({"train/loss": steps(*range(1, 251)), "val/accuracy": steps(0, 100, 200)})
    assert run_progress(data, ["val/accuracy"], 200) == 200
    assert run_progress(data, ["val/accuracy"], 199) == 200
    assert run_progress(data, ["val/accuracy"], 201) == 250  # stops early: the whole run is scanned


def test_an_incomplete_decision_is_false_with_its_message():
    assert check_completeness(normalize({"eval/score": 0.7}), [], 10, None) == Completeness(
        False, "run logged no steps (expected 10)"
    )
    assert check_completeness(STOPPED, [], 200, 60) == Completeness(False, "run stopped at step 60 of 200")
    data = normalize({"train/loss": steps(*range(1, 201)), "train/kl": steps(*range(1, 101))})
    assert check_completeness(data, ["train/kl"], 200, 200) == Completeness(
        False, "'train/kl' stopped at step 100 of 200"
    )
