"""Training messages to and from the wire (:mod:`llmgw.core.trainingstream`)."""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.core.trainingstream import (
    CancelTraining,
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingFile,
    TrainingPiece,
    TrainingState,
    TrainingStatus,
)
from llmgw.protocol import agent_pb2 as pb

_STATES = {
    TrainingState.PREPARING: pb.TRAINING_STATE_PREPARING,
    TrainingState.TRAINING: pb.TRAINING_STATE_TRAINING,
    TrainingState.CONVERTING: pb.TRAINING_STATE_CONVERTING,
    TrainingState.FINISHED: pb.TRAINING_STATE_FINISHED,
    TrainingState.FAILED: pb.TRAINING_STATE_FAILED,
    TrainingState.CANCELLED: pb.TRAINING_STATE_CANCELLED,
}
_FROM_WIRE = {wire: state for state, wire in _STATES.items()}


def _files(files: Iterable[TrainingFile]) -> list[pb.WeightsFile]:
    return [pb.WeightsFile(sha256=f.sha256, filename=f.filename, size=f.size) for f in files]


def _from_files(files: Iterable[pb.WeightsFile]) -> tuple[TrainingFile, ...]:
    return tuple(TrainingFile(sha256=f.sha256, filename=f.filename, size=f.size) for f in files)


def encode_start(message: StartTraining) -> pb.StartTraining:
    return pb.StartTraining(
        job_id=message.job_id,
        attempt=message.attempt,
        model=message.model,
        weights=_files(message.weights),
        device=message.device,
        memory_mb=message.memory_mb,
        pairs=message.pairs,
        options=message.options,
        gguf=message.gguf,
    )


def decode_start(message: pb.StartTraining) -> StartTraining:
    return StartTraining(
        job_id=message.job_id,
        attempt=message.attempt,
        model=message.model,
        weights=_from_files(message.weights),
        device=message.device,
        memory_mb=message.memory_mb,
        pairs=message.pairs,
        options=message.options or "{}",
        gguf=message.gguf,
    )


def encode_cancel(message: CancelTraining) -> pb.CancelTraining:
    return pb.CancelTraining(job_id=message.job_id, reason=message.reason)


def decode_cancel(message: pb.CancelTraining) -> CancelTraining:
    return CancelTraining(job_id=message.job_id, reason=message.reason)


def encode_fetch(message: TrainingFetch) -> pb.TrainingFetch:
    return pb.TrainingFetch(
        job_id=message.job_id, filename=message.filename, offset=message.offset, length=message.length
    )


def decode_fetch(message: pb.TrainingFetch) -> TrainingFetch:
    return TrainingFetch(
        job_id=message.job_id, filename=message.filename, offset=message.offset, length=message.length
    )


def encode_collected(message: TrainingCollected) -> pb.TrainingCollected:
    return pb.TrainingCollected(job_id=message.job_id)


def decode_collected(message: pb.TrainingCollected) -> TrainingCollected:
    return TrainingCollected(job_id=message.job_id)


def encode_status(message: TrainingStatus) -> pb.TrainingStatus:
    return pb.TrainingStatus(
        job_id=message.job_id,
        attempt=message.attempt,
        state=_STATES[message.state],
        step=message.step,
        steps=message.steps,
        loss=message.loss,
        peak_memory_bytes=message.peak_memory_bytes,
        error=message.error,
        results=_files(message.results),
        log_lines=list(message.log_lines),
        detail=message.detail,
    )


def decode_status(message: pb.TrainingStatus) -> TrainingStatus | None:
    """None for a state this side does not know (a newer peer's)."""
    state = _FROM_WIRE.get(message.state)
    if state is None:
        return None
    return TrainingStatus(
        job_id=message.job_id,
        attempt=message.attempt,
        state=state,
        step=message.step,
        steps=message.steps,
        loss=message.loss,
        peak_memory_bytes=message.peak_memory_bytes,
        error=message.error,
        results=_from_files(message.results),
        log_lines=tuple(message.log_lines),
        detail=message.detail,
    )


def encode_piece(message: TrainingPiece) -> pb.TrainingPiece:
    return pb.TrainingPiece(
        job_id=message.job_id,
        filename=message.filename,
        offset=message.offset,
        data=message.data,
        error=message.error,
    )


def decode_piece(message: pb.TrainingPiece) -> TrainingPiece:
    return TrainingPiece(
        job_id=message.job_id,
        filename=message.filename,
        offset=message.offset,
        data=message.data,
        error=message.error,
    )
