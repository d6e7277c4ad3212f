"""Blob uses: what names a mirror blob, so it is not removed from under it.

A blob is in use while a model's definition names it (weights, a projector,
a repository's other files, an adapter's files), an engine build the mirror
records (``builds.json``) carries it, a training job not ended reads it, or
a client's file (``/v1/files``) is made of it. :func:`blob_uses` says which,
in words an error shows; ``DELETE /api/mirror/blobs/{sha256}`` answers 409
with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from llmgw.mirror.builds import BuildIndex
from llmgw.store.database import Store

SHOWN = 5
"""Uses named of each sort at most."""


def named_digests(value: Any) -> Iterator[str]:
    """Every ``sha256`` a definition (any JSON value) holds, at any depth, as 64 lower-case digits."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if key == "sha256" and isinstance(inner, str):
                    yield inner.removeprefix("sha256:").lower()
                else:
                    pending.append(inner)
        elif isinstance(item, list):
            pending.extend(item)


async def blob_uses(store: Store, builds: BuildIndex, sha256: str) -> list[str]:
    """What names blob ``sha256`` ("model m", "engine build …", "training job …", "file …");
    empty: nothing does."""
    uses = [
        f"model {record.name}"
        for record in await store.models.list()
        if sha256 in set(named_digests(record.definition))
    ][:SHOWN]
    uses += [
        f"engine build {build.key}"
        for build in builds.all()
        if any(asset.sha256 == sha256 for asset in build.assets)
    ][:SHOWN]
    uses += [
        f"training job {job.id}"
        for job in await store.training.list(unfinished=True)
        if sha256 in set(named_digests(job.weights))
    ][:SHOWN]
    uses += [f"file {file_id}" for file_id in await store.files.naming(sha256, SHOWN)]
    return uses
