"""The trainer's pure parts (options, pairs, the answer-only labels), without torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.core.training import TrainingOptions
from llmgw.training import trainer


class Tokenizer:
    """A chat-template tokenizer of one id per character: ``<u>`` the user's turn, ``<a>`` the assistant's."""

    eos_token_id = 0

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = False, tokenize: bool = True
    ) -> list[int]:
        text = "".join(f"<{m['role'][0]}>{m['content']}." for m in messages)
        return [ord(c) for c in text + ("<a>" if add_generation_prompt else "")]

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def test_the_loss_is_taken_on_the_answer_only() -> None:
    ids, labels = trainer.encode(Tokenizer(), "q?", "yes", 100)
    prompt = len("<u>q?.<a>")
    assert len(ids) == len(labels)
    assert labels[:prompt] == [-100] * prompt
    assert "".join(chr(i) for i in labels[prompt:]) == "yes."


def test_a_pair_longer_than_max_length_is_cut() -> None:
    ids, labels = trainer.encode(Tokenizer(), "q?", "a long answer", 12)
    assert len(ids) == len(labels) == 12
    assert labels.count(-100) == len("<u>q?.<a>")


def test_options_take_their_defaults_and_unknown_ones_are_refused() -> None:
    assert trainer.options_of('{"steps": 5}') == {**trainer.DEFAULTS, "steps": 5}
    with pytest.raises(SystemExit, match="unknown training options epochs; the options are rank"):
        trainer.options_of('{"epochs": 3}')


def test_the_control_planes_options_are_the_trainers_with_the_same_defaults() -> None:
    submitted = TrainingOptions().model_dump(mode="json")
    assert {**submitted, "target_modules": list(submitted["target_modules"])} == trainer.DEFAULTS


def test_pairs_are_read_and_a_bad_one_is_named(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"question": "a", "answer": "b"}\n\n{"question": "c", "answer": "d"}\n')
    assert trainer.read_pairs(pairs) == [("a", "b"), ("c", "d")]
    pairs.write_text('{"question": "a"}\n')
    with pytest.raises(SystemExit, match="pair 1 is not"):
        trainer.read_pairs(pairs)
    pairs.write_text("")
    with pytest.raises(SystemExit, match="no question/answer pairs"):
        trainer.read_pairs(pairs)
