"""A finished training job's result files on the node: described by sha256, served a piece at a time."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llmgw.core.trainingstream import MAX_PIECE_BYTES, TrainingFetch, TrainingFile, TrainingPiece
from llmgw.errors import LlmgwError
from llmgw.mirror.blobs import hash_file


def describe(out: Path, names: list[str]) -> tuple[TrainingFile, ...]:
    """The files the trainer named in ``out``, each with its sha256 and size; blocking."""
    files = []
    for name in names:
        path = out / name
        if "/" in name or not path.is_file():
            raise LlmgwError(
                f"the trainer named a result {name!r} it did not write", "report this; the job may be retried"
            )
        sha, size = hash_file(path)
        files.append(TrainingFile(sha, name, size))
    return tuple(files)


def missing(node_id: str, fetch: TrainingFetch) -> TrainingPiece:
    """The answer for a file this node does not hold."""
    what = f"no file {fetch.filename!r} of training job {fetch.job_id}"
    return TrainingPiece(fetch.job_id, fetch.filename, fetch.offset, error=f"node {node_id} has {what}")


def piece(node_id: str, out: Path, results: Iterable[TrainingFile], fetch: TrainingFetch) -> TrainingPiece:
    """At most :data:`MAX_PIECE_BYTES` of a result from the offset asked (empty at its end).

    Only the files named in ``results`` are served (never another path under the job's folder).
    """
    if fetch.filename not in {file.filename for file in results}:
        return missing(node_id, fetch)
    length = max(0, min(fetch.length, MAX_PIECE_BYTES))
    try:
        with (out / fetch.filename).open("rb") as stream:
            stream.seek(fetch.offset)
            data = stream.read(length)
    except (OSError, ValueError) as error:
        return TrainingPiece(
            fetch.job_id,
            fetch.filename,
            fetch.offset,
            error=f"cannot read {fetch.filename} from byte "
            f"{fetch.offset}: {error}; fetch it again from the start",
        )
    return TrainingPiece(fetch.job_id, fetch.filename, fetch.offset, data)
