"""Greedy evaluation: per-problem outcomes in problem order, accuracy is their mean.

The engine is a stub that answers from a table (the unit under test is the scoring, not
generation); the tokenizer and chat template are the real tiny model's.
"""

import pytest
from transformers import AutoTokenizer

from posttrain.algorithms.evaluation import greedy_accuracy, greedy_outcomes
from posttrain.data.chat import ChatEncoder
from posttrain.data.types import MathProblem
from posttrain.models.generation.interfaces import GenerationOutput


class TableEngine:
    """Answers each prompt with a fixed text; records the sampling params it was given."""

    def __init__(self, chat: ChatEncoder, answers: dict[str, str]):
        encode = chat.tokenizer.encode
        self.by_prompt = {chat.prompt(q): encode(a, add_special_tokens=False) for q, a in answers.items()}
        self.params = None

    def generate(self, prompts, params):
        self.params = params
        ids = [self.by_prompt[tuple(p)] for p in prompts]
        return GenerationOutput(ids, [[0.0] * len(i) for i in ids], 0)


@pytest.fixture
def chat(tiny_model_path):
    return ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_path))


def test_outcomes_follow_problem_order_and_accuracy_is_their_mean(chat):
    problems = [MathProblem("12+34=", "46", "46"), MathProblem("1+1=", "2", "2"), MathProblem("9+9=", "18", "18")]
    engine = TableEngine(chat, {"12+34=": "46", "1+1=": "3", "9+9=": "18"})
    assert greedy_outcomes(engine, chat, problems, max_new_tokens=4) == [1.0, 0.0, 1.0]
    assert engine.params.greedy and engine.params.max_new_tokens == 4
    assert greedy_accuracy(engine, chat, problems, max_new_tokens=4) == pytest.approx(2 / 3)


def test_accuracy_over_no_problem_is_an_error(chat):
    with pytest.raises(ValueError, match="needs at least one problem"):
        greedy_accuracy(TableEngine(chat, {}), chat, [], max_new_tokens=4)
