"""Collecting a finished training job's results: each file pulled a piece at a time into the mirror.

The control plane asks the job's node for ``length`` bytes of a file from an
offset (:class:`~llmgw.core.trainingstream.TrainingFetch`); the node answers
with a :class:`~llmgw.core.trainingstream.TrainingPiece` on its stream, which
the session hands to :meth:`Pieces.deliver`. Bytes go through the mirror's
:class:`~llmgw.mirror.fetching.BlobWriter` into the blob's place, so a
collection cut short (the node's stream ended, this control plane stopped
leading) resumes from what this mirror holds, and a file whose bytes do not
hash to the sha256 the node named is never kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmgw.core.trainingstream import TrainingFetch, TrainingFile, TrainingPiece
from llmgw.errors import DownloadError, LlmgwError
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.fetching import BlobWriter
from llmgw.protocol.links import ControlLink


class ResultMissing(LlmgwError):
    """The node no longer has a result file it named (it answered the fetch with an error)."""


class Pieces:
    """The fetches waiting for their piece, by (job, file, offset)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._waiting: dict[tuple[str, str, int], asyncio.Future[TrainingPiece]] = {}

    def deliver(self, piece: TrainingPiece) -> bool:
        """Hand a piece to the fetch waiting for it; False when none is (a late answer)."""
        future = self._waiting.get((piece.job_id, piece.filename, piece.offset))
        if future is None or future.done():
            return False
        future.set_result(piece)
        return True

    async def fetch(self, channel: ControlLink, job_id: str, filename: str, offset: int) -> TrainingPiece:
        """Ask for the piece of ``filename`` at ``offset`` and wait for it (TimeoutError past the timeout)."""
        key = (job_id, filename, offset)
        future: asyncio.Future[TrainingPiece] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        try:
            await channel.send(TrainingFetch(job_id=job_id, filename=filename, offset=offset))
            async with asyncio.timeout(self.timeout_s):
                return await future
        finally:
            if self._waiting.get(key) is future:
                del self._waiting[key]


async def collect_file(
    pieces: Pieces,
    channel: ControlLink,
    blobs: BlobStore,
    job_id: str,
    result: TrainingFile,
    progress: Callable[[int], None] = lambda done: None,
) -> None:
    """Pull ``result`` of ``job_id`` into ``blobs`` unless it is there, resuming from a partial copy.

    ChecksumMismatch when the bytes do not hash to ``result.sha256`` (nothing
    kept); ResultMissing when the node has no such file; DownloadError when the
    node's answer runs short or long; TimeoutError or ChannelClosed when the
    node stops answering (the partial kept for the next try).
    """
    if blobs.has(result.sha256):
        return
    writer = BlobWriter(blobs.path_for(result.sha256), result.sha256, result.size)
    offset = await writer.start()
    try:
        while offset < result.size:
            piece = await pieces.fetch(channel, job_id, result.filename, offset)
            if piece.error:
                await writer.discard()
                raise ResultMissing(
                    f"node has no result {result.filename} of job {job_id}: {piece.error}",
                    "submit the job again: its node no longer holds what it made",
                )
            if not piece.data:
                raise DownloadError(
                    f"{result.filename} of job {job_id} ended at {offset} of {result.size} bytes",
                    "the node reported a size its file does not have; submit the job again",
                )
            await writer.write(piece.data)
            offset += len(piece.data)
            progress(offset)
        await writer.finish()
    finally:
        await writer.close()
