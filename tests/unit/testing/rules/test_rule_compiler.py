"""Tests for posttrain/testing/rules/compiler.py: what a rule may say, and the one-line usage error when it may not.

A rule that does not compile stops the check before anything runs (exit 2 in the CLI), and the
error is the only thing its author sees: the messages are asserted word for word.
"""

from __future__ import annotations

import pytest

from posttrain.testing.rules import compiler
from posttrain.testing.rules.compiler import MAX_DEPTH, MAX_RULE_CHARS, compile_rule
from posttrain.testing.rules.errors import RuleError

HELPER_NAMES = "min, max, mean, median, ratio_above, all_finite, first, last, last_step, std, slope, abs, len, round"


def error_of(rule: str) -> str:
    with pytest.raises(RuleError) as e:
        compile_rule(rule)
    return str(e.value)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("x > 1", f"rule 'x > 1': name 'x' is not allowed (only `data` and calls of {HELPER_NAMES})"),
        ("{1: 2} == 1", "rule '{1: 2} == 1': Dict expression `{1: 2}` is not allowed"),
        ("'__class__' == 'a'", "rule \"'__class__' == 'a'\": dunder string '__class__' is not allowed"),
        ("mean(**data)", "rule 'mean(**data)': **kwargs is not allowed"),
        ('data["x"]() > 1', "rule 'data[\"x\"]() > 1': call of `data['x']` is not allowed"),
        ("data.keys()", "rule 'data.keys()': attribute access `data.keys` is not allowed"),
        ("open('f')", f"rule \"open('f')\": call of `open` is not allowed (helpers: {HELPER_NAMES})"),
        ("mean(data['x'], ignore_top=0.1) > 1",
         "rule \"mean(data['x'], ignore_top=0.1) > 1\": `mean(data['x'], ignore_top=0.1)`: "
         "got an unexpected keyword argument 'ignore_top'"),
        ("data >", "rule 'data >': invalid syntax (invalid syntax)"),
        ("a\udcffb", "rule 'a\\udcffb': not UTF-8 text (byte 0xff at character 1)"),
    ],
)
def test_a_rule_outside_the_whitelist_is_refused_with_one_exact_line(rule, message):
    assert error_of(rule) == message


def test_keyword_arguments_of_a_helper_compile():
    compile_rule('mean(data["x"], range_start=2, ignore_top_p=0.1) > 0')


def test_nesting_up_to_max_depth_compiles_and_one_level_more_does_not():
    # "-" * k + "1": Expression, k unary minuses, then the constant (and each minus's operator node)
    compile_rule("-" * (MAX_DEPTH - 2) + "1")
    deeper = "-" * (MAX_DEPTH - 1) + "1"
    assert error_of(deeper) == f"rule {deeper!r}: nested more than {MAX_DEPTH} levels deep"


def test_a_rule_of_max_rule_chars_compiles_and_a_longer_one_does_not():
    longest = "1 < 2" + " " * (MAX_RULE_CHARS - 5)
    compile_rule(longest)
    too_long = longest + " "
    assert error_of(too_long) == (
        f"rule {repr(too_long)[:99]}…: {MAX_RULE_CHARS + 1} characters, more than the {MAX_RULE_CHARS} allowed"
    )


def test_a_parser_that_runs_out_of_stack_is_a_rule_error(monkeypatch):
    def exhausted(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(compiler.ast, "parse", exhausted)
    assert error_of("1 < 2") == "rule '1 < 2': nested too deeply to parse"


@pytest.mark.parametrize("length", [99, 100])
def test_a_rule_is_quoted_whole_up_to_100_characters(length):
    rule = "x" + " " * (length - 3)  # its repr adds two quotes
    assert len(repr(rule)) == length
    assert error_of(rule) == f"rule {rule!r}: name 'x' is not allowed (only `data` and calls of {HELPER_NAMES})"


@pytest.mark.parametrize("length", [101, 161])
def test_a_longer_rule_is_quoted_as_its_first_99_characters_and_an_ellipsis(length):
    rule = "x" + " " * (length - 3)
    assert error_of(rule) == (
        f"rule {repr(rule)[:99]}…: name 'x' is not allowed (only `data` and calls of {HELPER_NAMES})"
    )
