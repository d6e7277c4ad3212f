"""Training jobs' rules: their states, options, question/answer pairs and base files, checked.

A job is submitted with a catalog model, the pairs to train on and options;
:func:`parse_pairs` and :class:`TrainingOptions` refuse bad input naming each
problem (a pair by its line number), :func:`base_files` picks the base model's
safetensors files, and :func:`wants_gguf` says whether a GGUF adapter is made
too. Where the job stands is a :class:`JobState`; on its node the job has a
:class:`~llmgw.core.trainingstream.TrainingState` of its own, which
:func:`job_state` maps onto it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmgw.core.catalog import ModelDefinition, problems_of
from llmgw.core.engines import AdapterShape
from llmgw.core.trainingstream import MAX_PAIRS_BYTES, TrainingFile, TrainingState
from llmgw.errors import ValidationFailed

MAX_LOG_LINES = 200
"""The last lines of the trainer's output a job keeps."""
MAX_LOSSES = 500
"""The loss readings a job keeps (the newest; older ones are thinned out)."""
MAX_RETRY = 10
JOB_ID = re.compile(r"tj_[0-9a-f]{12}")
CPU = "cpu"
CARD = "card"
ANY_NODE = "any"


class JobState(StrEnum):
    """Where a job stands, as the control plane keeps it."""

    QUEUED = "queued"
    """Waiting for a node (or card) with the room: the reasons say why none fits."""
    PLACED = "placed"
    """Sent to its node; no status heard yet."""
    PREPARING = "preparing"
    TRAINING = "training"
    CONVERTING = "converting"
    COLLECTING = "collecting"
    """Finished on its node: the control plane pulls the results into the mirror."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @property
    def on_node(self) -> bool:
        """Sent to a node and not yet ended there (collecting included: the node holds the results)."""
        return self in ON_NODE


ON_NODE = frozenset(
    {JobState.PLACED, JobState.PREPARING, JobState.TRAINING, JobState.CONVERTING, JobState.COLLECTING}
)

_FROM_NODE = {
    TrainingState.PREPARING: JobState.PREPARING,
    TrainingState.TRAINING: JobState.TRAINING,
    TrainingState.CONVERTING: JobState.CONVERTING,
    TrainingState.FINISHED: JobState.COLLECTING,
    TrainingState.FAILED: JobState.FAILED,
    TrainingState.CANCELLED: JobState.CANCELLED,
}


def job_state(state: TrainingState) -> JobState:
    """The job's state once its node reports ``state`` (``finished`` there: collecting here)."""
    return _FROM_NODE[state]


class TrainingOptions(BaseModel):
    """How the LoRA is trained; sent to the trainer as JSON (the defaults are the trainer's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=8, ge=1, le=512)
    """The LoRA rank (PEFT's ``r``)."""
    alpha: int = Field(default=16, ge=1, le=4096)
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    steps: int = Field(default=100, ge=1, le=100_000)
    learning_rate: float = Field(default=2e-4, gt=0.0, le=1.0)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    max_length: int = Field(default=512, ge=8, le=131_072)

    @field_validator("target_modules")
    @classmethod
    def _modules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one module (q_proj, v_proj ...)")
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_.]{1,128}", name):
                raise ValueError(f"{name!r} is no module name (letters, digits, '_' and '.')")
        return value


def parse_options(data: object) -> TrainingOptions:
    """Options from a request's ``options`` (a mapping; None: the defaults), every problem named."""
    try:
        return TrainingOptions.model_validate(data or {})
    except ValidationError as error:
        problems = [(f"options.{at}" if at else "options", why) for at, why in problems_of(error)]
        raise ValidationFailed(problems, "fix the options named ('llmgw ctl train submit --help')") from None


def parse_pairs(data: bytes) -> list[tuple[str, str]]:
    """The question/answer pairs of JSON lines, one ``{"question": ..., "answer": ...}`` a line.

    Blank lines are skipped; every bad line is named by its number (from 1).
    More than :data:`MAX_PAIRS_BYTES` or no pair at all is refused too.
    """
    if len(data) > MAX_PAIRS_BYTES:
        raise ValidationFailed(
            [("pairs", f"{len(data)} bytes; at most {MAX_PAIRS_BYTES} are taken")],
            "train on fewer pairs, or split them over several jobs",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValidationFailed(
            [("pairs", f"not UTF-8 (byte {error.start})")], "send UTF-8 JSON lines"
        ) from None
    pairs: list[tuple[str, str]] = []
    problems: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        at = f"pairs.line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append((at, f"not JSON ({error.msg})"))
            continue
        if not isinstance(item, dict):
            problems.append((at, 'not an object; write {"question": "...", "answer": "..."}'))
            continue
        extra = sorted(set(item) - {"question", "answer"})
        if extra:
            problems.append((at, f"unknown field {extra[0]!r}; only question and answer are read"))
            continue
        question, answer = item.get("question"), item.get("answer")
        if not isinstance(question, str) or not question.strip():
            problems.append((at, "question is missing or empty"))
        elif not isinstance(answer, str) or not answer.strip():
            problems.append((at, "answer is missing or empty"))
        else:
            pairs.append((question, answer))
    if problems:
        shown = problems[:20] + (
            [("pairs", f"{len(problems) - 20} more lines are wrong")] if len(problems) > 20 else []
        )
        raise ValidationFailed(shown, 'fix the lines named: each is {"question": "...", "answer": "..."}')
    if not pairs:
        raise ValidationFailed(
            [("pairs", "no question/answer pair")], 'give one {"question", "answer"} a line'
        )
    return pairs


def pairs_bytes(pairs: Iterable[tuple[str, str]]) -> bytes:
    """Pairs as the JSON lines a job stores and its node reads."""
    lines = [json.dumps({"question": q, "answer": a}, ensure_ascii=False) for q, a in pairs]
    return ("\n".join(lines) + "\n").encode()


def wants_gguf(model: ModelDefinition) -> bool:
    """Whether a GGUF adapter is made too: some profile serves the model with a GGUF-adapter engine."""
    return any(p.capabilities.adapter_shape is AdapterShape.GGUF_FILE for p in model.profiles)


def base_files(model: ModelDefinition, named: Iterable[TrainingFile]) -> tuple[TrainingFile, ...]:
    """The base model's files to train on: ``named`` when given, else the model's own safetensors.

    A model kept as GGUF (llama.cpp) names no safetensors: the job must name
    them. Whichever they are, a ``*.safetensors`` file and ``config.json`` are needed.
    """
    files = tuple(named)
    if not files:
        source = model.source
        if source is None:
            raise ValidationFailed(
                [("model", f"model {model.name!r} is served by its provider; it has no weights to train")],
                "train a model the cluster runs from weights in the mirror",
            )
        if source.format != "safetensors":
            raise ValidationFailed(
                [("weights", f"model {model.name!r} is kept as GGUF; training reads safetensors")],
                "name the base model's safetensors, config.json and tokenizer files in the mirror "
                "(--weights SHA256:FILENAME, repeated; 'llmgw mirror import-hf' fetches them)",
            )
        files = (
            TrainingFile(source.sha256, source.filename, source.size),
            *(TrainingFile(f.sha256, f.filename, f.size) for f in source.files),
        )
    names = [f.filename for f in files]
    problems = []
    if not any(name.endswith(".safetensors") for name in names):
        problems.append(("weights", "no *.safetensors file among them"))
    if "config.json" not in names:
        problems.append(("weights", "no config.json among them (the trainer reads the architecture there)"))
    if len(set(names)) != len(names):
        problems.append(("weights", "two files have the same name"))
    if problems:
        raise ValidationFailed(problems, "name the base model's safetensors, config.json and tokenizer files")
    return files


def parse_weight(text: str) -> TrainingFile:
    """``SHA256:FILENAME`` as the CLI takes a base file; ValidationFailed otherwise."""
    sha256, colon, filename = text.strip().removeprefix("sha256:").partition(":")
    sha256 = sha256.lower()
    if not colon or not re.fullmatch(r"[0-9a-f]{64}", sha256) or not filename or "/" in filename:
        raise ValidationFailed([("weights", f"{text!r} is not SHA256:FILENAME")], "e.g. 3fa9…e1:config.json")
    return TrainingFile(sha256, filename, 0)
