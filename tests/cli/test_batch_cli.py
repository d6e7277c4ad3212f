"""``llmgw ctl batch list|show|cancel`` (and ``/api/batches`` under them) through a real admin API."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from llmgw.core.batches import BatchLine, BatchStatus
from llmgw.store import Store

from .conftest import AdminServer
from .test_tenancy_cli import run
from .test_training_cli import refused


def _batch(folder: Path, batch_id: str, answered: int, status: BatchStatus = BatchStatus.IN_PROGRESS) -> None:
    async def make() -> None:
        async with await Store.open(f"sqlite+aiosqlite:///{folder / 'llmgw.db'}") as store:
            await store.batches.add(
                batch_id=batch_id,
                owner="project:acme/ml/chat",
                key_id="k1",
                endpoint="/v1/chat/completions",
                input_file_id="file-in",
                completion_window="24h",
                window_s=86400,
                metadata=None,
            )
            lines = [BatchLine(i, f"r{i}", {"model": "m"}) for i in range(4)]
            await store.batches.add_requests(batch_id, lines)
            await store.batches.move(batch_id, BatchStatus.IN_PROGRESS)
            for i in range(answered):
                await store.batches.answer(batch_id, i, ok=i != 0, result={"custom_id": f"r{i}"})
            if status is not BatchStatus.IN_PROGRESS:
                await store.batches.move(batch_id, status)

    asyncio.run(make())


def test_batches_are_listed_shown_and_cancelled(admin_server: AdminServer, tmp_path: Path) -> None:
    _batch(tmp_path, "batch_running", answered=3)
    _batch(tmp_path, "batch_final", answered=4, status=BatchStatus.FINALIZING)
    listed = json.loads(run(admin_server, "ctl", "batch", "list", "--json"))
    assert {b["id"]: (b["completed"], b["failed"], b["total"]) for b in listed} == {
        "batch_running": (2, 1, 4),
        "batch_final": (3, 1, 4),
    }
    assert "3/4" in run(admin_server, "ctl", "batch", "list", "--running")
    shown = run(admin_server, "ctl", "batch", "show", "batch_running")
    assert "3 of 4 answered (1 failed)" in shown and "in_progress" in shown
    cancelled = json.loads(run(admin_server, "ctl", "batch", "cancel", "batch_running", "--json"))
    assert cancelled["status"] == "cancelling"
    assert "finalizing" in refused(admin_server, "ctl", "batch", "cancel", "batch_final")
    assert "no batch" in refused(admin_server, "ctl", "batch", "show", "batch_nope")


def test_show_watch_of_an_ended_batch_shows_it_at_once(admin_server: AdminServer, tmp_path: Path) -> None:
    _batch(tmp_path, "batch_done", answered=4, status=BatchStatus.FINALIZING)

    async def complete() -> None:
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}") as store:
            await store.batches.move("batch_done", BatchStatus.COMPLETED, output_file_id="file-out")

    asyncio.run(complete())
    shown = json.loads(run(admin_server, "ctl", "batch", "show", "batch_done", "--watch", "--json"))
    assert (shown["status"], shown["output_file_id"]) == ("completed", "file-out")
