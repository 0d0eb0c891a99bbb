"""A chat template like a real instruct model's: the loops prompt after the assistant header and
train exactly the response.

The tiny tokenizer's own template has no roles (the user turn verbatim, the answer and EOS). Real
instruct models render a system prompt, a header per turn, emit the assistant header only under
``add_generation_prompt``, and close a turn with an end-of-turn token followed by text between
turns. A loop that renders its prompts without the generation prompt (the model must then write
the header itself) or trains the header or the text after the end of turn passes every test on the
role-less template. Here a ChatML-style template (built locally: the ASCII tiny tokenizer with
that template, no hub) runs the real loops in this process (``in_process.py``), and the prompts and
trained tokens are read where they reach the engine and the trainer.
"""

from __future__ import annotations

import pytest

from posttrain.algorithms import grpo, sft
from posttrain.data.chat import ChatEncoder

GRPO_YAML = "examples/configs/grpo_arithmetic.yaml"
SFT_YAML = "examples/configs/sft_arithmetic.yaml"
SYSTEM = "You are a careful calculator."
# ChatML, as Qwen's instruct models render it; the tiny tokenizer's EOS closes each turn.
INSTRUCT_TEMPLATE = (
    "{{- '<|im_start|>system\\n' + '" + SYSTEM + "' + eos_token + '\\n' -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def instruct_model(tmp_path_factory) -> str:
    """A tiny model directory whose tokenizer carries ``INSTRUCT_TEMPLATE`` (ASCII charset)."""
    from posttrain.config import TinyModelConfig
    from posttrain.models.tiny import build_model, build_tokenizer

    path = tmp_path_factory.mktemp("instruct_model")
    tokenizer = build_tokenizer("ascii")
    tokenizer.chat_template = INSTRUCT_TEMPLATE
    model = build_model(TinyModelConfig(charset="ascii"), len(tokenizer), tokenizer.pad_token_id,
                        tokenizer.eos_token_id)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(instruct_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(instruct_model)


def expected_prompt(question: str, eos: str) -> str:
    return f"<|im_start|>system\n{SYSTEM}{eos}\n<|im_start|>user\n{question}{eos}\n{HEADER}"


def test_the_template_puts_the_header_only_in_the_generation_prompt(tokenizer) -> None:
    chat = ChatEncoder(tokenizer)
    assert tokenizer.decode(chat.prompt("12+34=")) == expected_prompt("12+34=", tokenizer.eos_token)
    prompt, response = chat.sft_example("12+34=", "46")
    assert tokenizer.decode(prompt).endswith(HEADER)
    assert tokenizer.decode(response) == "46" + tokenizer.eos_token  # the turn's newline after EOS is not trained


@pytest.mark.slow(reason="a GRPO run through a real chat template")
def test_grpo_samples_after_the_assistant_header(in_process, instruct_model, tokenizer, tmp_path) -> None:
    run = in_process.run(grpo, GRPO_YAML, [f"model.path={instruct_model}", f"logger.log_dir={tmp_path}",
                                           "grpo.num_steps=1", "grpo.num_prompts_per_step=4",
                                           "grpo.completions_per_prompt=2", "generation.max_new_tokens=2",
                                           "grpo.val_period=0", "generation.backend=hf",
                                           "generation.refit_probe.num_sequences=0"])
    calls = [c for c in run.calls("generation", "generate") if not c.kwargs["params"].greedy]
    prompts = [tokenizer.decode(p) for c in calls for p in c.args[0]]
    assert len(prompts) == 8
    for text in prompts:
        question = text.split("<|im_start|>user\n")[1].split(tokenizer.eos_token)[0]
        assert text == expected_prompt(question, tokenizer.eos_token), text


def test_sft_trains_exactly_the_response_and_its_end_of_turn(in_process, instruct_model, tokenizer,
                                                             tmp_path) -> None:
    run = in_process.run(sft, SFT_YAML, [f"model.path={instruct_model}", f"logger.log_dir={tmp_path}",
                                         "sft.num_steps=1", "sft.batch_size=4", "sft.val_period=0",
                                         "sft.val_accuracy=false", "sft.val_loss_size=2"])
    [train] = run.calls("policy", "train")
    batch = train.args[0]
    for b in range(len(batch)):
        p, n = int(batch.prompt_lens[b]), int(batch.completion_lens[b])
        prompt = tokenizer.decode(batch.input_ids[b, :p].tolist())
        trained = tokenizer.decode(batch.input_ids[b, p:p + n].tolist())
        question = prompt.split("<|im_start|>user\n")[1].split(tokenizer.eos_token)[0]
        assert prompt == expected_prompt(question, tokenizer.eos_token)
        a, b_ = question.rstrip("=").split("+")
        assert trained == f"{int(a) + int(b_)}{tokenizer.eos_token}", (prompt, trained)
        assert batch.completion_mask[b, :n].tolist() == [1.0] * n
