"""Training jobs' rules: pairs by line, options by name, base files, GGUF by the engine, states."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.training import (
    JobState,
    base_files,
    job_state,
    pairs_bytes,
    parse_options,
    parse_pairs,
    parse_weight,
    wants_gguf,
)
from llmgw.core.trainingstream import MAX_PAIRS_BYTES, TrainingFile, TrainingState
from llmgw.errors import ValidationFailed

SHA = "ab" * 32


def problems(error: pytest.ExceptionInfo[ValidationFailed]) -> list[tuple[str, str]]:
    return error.value.problems


def test_pairs_round_trip_and_blank_lines_are_skipped() -> None:
    pairs = [("What colour?", "Blue — always"), ("Two?", "2")]
    assert parse_pairs(pairs_bytes(pairs) + b"\n\n") == pairs


def test_each_bad_pair_is_named_by_its_line() -> None:
    text = b'{"question": "q", "answer": "a"}\n{"question": ""}\n{"answer": "a"}\n"text"\n{bad\n'
    with pytest.raises(ValidationFailed) as error:
        parse_pairs(text)
    assert [at for at, _ in problems(error)] == [f"pairs.line {n}" for n in (2, 3, 4, 5)]
    assert error.value.hint


def test_too_many_bytes_no_pair_and_not_utf8_are_refused() -> None:
    for data, said in (
        (b"x" * (MAX_PAIRS_BYTES + 1), "at most"),
        (b"\n\n", "no question"),
        (b"\xff", "UTF-8"),
    ):
        with pytest.raises(ValidationFailed, match=said):
            parse_pairs(data)


def test_options_have_defaults_and_bad_ones_are_named() -> None:
    assert parse_options(None).rank == 8
    with pytest.raises(ValidationFailed) as error:
        parse_options({"rank": 1000, "learning_rate": 0, "target_modules": ["q proj"]})
    assert {at for at, _ in problems(error)} == {
        "options.rank",
        "options.learning_rate",
        "options.target_modules",
    }


def test_base_files_are_the_models_safetensors_unless_named() -> None:
    model = parse_model(
        {
            "name": "m",
            "source": {
                "format": "safetensors",
                "sha256": SHA,
                "filename": "model.safetensors",
                "files": [{"sha256": "cd" * 32, "filename": "config.json"}],
            },
            "profiles": [{"engine": "vllm"}],
        }
    )
    assert [f.filename for f in base_files(model, [])] == ["model.safetensors", "config.json"]
    assert not wants_gguf(model)
    gguf = parse_model({"name": "g", "source": {"sha256": SHA}})
    assert wants_gguf(gguf)
    with pytest.raises(ValidationFailed, match="kept as GGUF"):
        base_files(gguf, [])
    with pytest.raises(ValidationFailed, match=r"no config\.json"):
        base_files(gguf, [TrainingFile(SHA, "model.safetensors", 0)])
    assert parse_weight(f"sha256:{SHA}:config.json") == TrainingFile(SHA, "config.json", 0)
    with pytest.raises(ValidationFailed, match="SHA256:FILENAME"):
        parse_weight("config.json")


def test_a_nodes_state_maps_onto_the_jobs() -> None:
    assert job_state(TrainingState.FINISHED) is JobState.COLLECTING
    assert job_state(TrainingState.TRAINING) is JobState.TRAINING
    assert JobState.COLLECTING.on_node and not JobState.QUEUED.on_node and JobState.CANCELLED.ended
