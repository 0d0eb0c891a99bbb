"""Tests for posttrain.data.gsm8k: loading GSM8K-format JSONL and its error messages."""

import json
import re
from pathlib import Path

import pytest

from posttrain.config import GSM8K_DIR
from posttrain.data.gsm8k import load_gsm8k
from posttrain.errors import ConfigError, DataError


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _record(question: str = "Q?", answer: str = "Work.\n#### 5") -> str:
    return json.dumps({"question": question, "answer": answer})


def test_real_train_file_loads_every_problem() -> None:
    problems = load_gsm8k(GSM8K_DIR / "train.jsonl")
    assert len(problems) == 7473
    first = problems[0]
    assert first.question.startswith("Natalia sold clips to 48 of her friends in April")
    assert first.answer == "72"
    assert first.solution.endswith("\n#### 72")
    # Line 346 has "#### 1,080": commas are removed from the final answer only.
    assert problems[345].answer == "1080"
    assert problems[345].solution.endswith("#### 1,080")
    assert all(p.answer.lstrip("-").isdigit() for p in problems)


def test_real_test_file_and_limit() -> None:
    assert len(load_gsm8k(GSM8K_DIR / "test.jsonl")) == 1319
    assert len(load_gsm8k(str(GSM8K_DIR / "test.jsonl"), limit=5)) == 5


def test_final_answer_commas_and_sign(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            _record(answer="So 1,000 + 250 = 1,250.\n#### 1,250"),
            _record(answer="#### -3"),
            _record(answer="#### 2,520,000 "),
            _record(answer="Draft: #### 4\nFixed:\n#### 6"),  # the last marker counts
        ],
    )
    assert [p.answer for p in load_gsm8k(path)] == ["1250", "-3", "2520000", "6"]


def test_blank_lines_are_skipped_and_limit_counts_problems(tmp_path: Path) -> None:
    path = _write(
        tmp_path, ["", _record(question="a"), "   ", _record(question="b"), ""]
    )
    assert [p.question for p in load_gsm8k(path)] == ["a", "b"]
    assert [p.question for p in load_gsm8k(path, limit=1)] == ["a"]


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match=re.escape(f"GSM8K file not found: {missing}")):
        load_gsm8k(missing)


def test_malformed_json_names_path_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record(), "", '{"question": "Q", "answer": '])
    with pytest.raises(DataError, match=re.escape(f"{path}:3")) as info:
        load_gsm8k(path)
    assert "JSON" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (json.dumps({"answer": "#### 5"}), "'question' is missing"),
        (json.dumps({"question": "Q"}), "'answer' is missing"),
        (json.dumps({"question": "Q", "answer": 5}), "'answer' is not a string"),
        (json.dumps({"question": "Q", "answer": "The answer is 5"}), "'####'"),
        (json.dumps({"question": "Q", "answer": "#### five"}), "not a number"),
        (json.dumps(["Q", "#### 5"]), "JSON object"),
    ],
)
def test_bad_record_names_line_and_problem(
    tmp_path: Path, line: str, expected: str
) -> None:
    path = _write(tmp_path, [_record(), line])
    with pytest.raises(DataError, match=re.escape(f"{path}:2")) as info:
        load_gsm8k(path)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_invalid_utf8_names_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(_record().encode() + b"\n\xff\xfe\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:2") + ".*UTF-8"):
        load_gsm8k(path)


def test_empty_file(tmp_path: Path) -> None:
    path = _write(tmp_path, ["", "  "])
    with pytest.raises(DataError, match="no problems"):
        load_gsm8k(path)
    (tmp_path / "zero.jsonl").write_bytes(b"")
    with pytest.raises(DataError, match=r"zero\.jsonl"):
        load_gsm8k(tmp_path / "zero.jsonl")


def test_bad_limit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="limit"):
        load_gsm8k(_write(tmp_path, [_record()]), limit=0)
