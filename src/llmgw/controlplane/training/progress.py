"""What a training job's messages carry: its StartTraining, and its progress once a status is taken in."""

from __future__ import annotations

import json
from typing import Any

from llmgw.core.training import MAX_LOG_LINES, MAX_LOSSES
from llmgw.core.trainingstream import StartTraining, TrainingFile, TrainingState, TrainingStatus
from llmgw.store.training import JobRecord


def start_message(job: JobRecord) -> StartTraining:
    """The StartTraining of a job's current attempt."""
    return StartTraining(
        job_id=job.id,
        attempt=job.attempt,
        model=job.model,
        weights=tuple(TrainingFile(w["sha256"], w["filename"], int(w.get("size", 0))) for w in job.weights),
        device=job.device,
        memory_mb=job.memory_mb,
        pairs=job.pairs,
        options=json.dumps(job.options, sort_keys=True),
        gguf=job.gguf,
    )


def ended_there(state: TrainingState) -> bool:
    return state in (TrainingState.FAILED, TrainingState.CANCELLED)


def progressed(job: JobRecord, held: dict[str, Any], status: TrainingStatus) -> dict[str, Any]:
    """The job's progress and log columns once ``status`` is taken in (over what is not yet written)."""
    progress = dict(held.get("progress", job.progress))
    losses = list(progress.get("losses", []))
    if status.steps and status.step and (not losses or status.step > losses[-1][0]):
        losses.append([status.step, status.loss])
        if len(losses) > MAX_LOSSES:
            losses = losses[::2]  # every other reading, the first kept: the curve's shape at half the points
    progress.update(
        step=status.step or progress.get("step", 0),
        steps=status.steps or progress.get("steps", 0),
        loss=status.loss if status.step else progress.get("loss", 0.0),
        losses=losses,
        peak_memory_bytes=max(status.peak_memory_bytes, int(progress.get("peak_memory_bytes", 0))),
        detail=status.detail,
    )
    logs = [*held.get("logs", job.logs), *status.log_lines][-MAX_LOG_LINES:]
    return {"progress": progress, "logs": logs}
