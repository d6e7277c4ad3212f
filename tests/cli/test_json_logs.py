"""--log-json: one JSON object a line, with the context's fields where they are set."""

from __future__ import annotations

import asyncio
import json
import logging

from llmgw.cli.output import JsonFormatter
from llmgw.observability import logcontext


def line(message: str, **extra: object) -> dict[str, object]:
    record = logging.LogRecord("llmgw.test", logging.WARNING, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    entry: dict[str, object] = json.loads(JsonFormatter().format(record))
    return entry


def test_a_line_without_context_has_the_basic_fields_only() -> None:
    assert set(line("hello")) == {"time", "level", "logger", "message"}


async def test_a_line_carries_the_fields_its_task_set_and_no_other_tasks() -> None:
    async def request(request_id: str, project: str) -> dict[str, object]:
        logcontext.REQUEST_ID.set(request_id)
        logcontext.PROJECT.set(project)
        logcontext.about(model="chat", replica="r1")
        await asyncio.sleep(0)  # the other task sets its own meanwhile
        return line("answered")

    first, second = await asyncio.gather(request("a", "team-a"), request("b", "team-b"))

    assert {k: first[k] for k in ("request_id", "project", "model", "replica")} == {
        "request_id": "a",
        "project": "team-a",
        "model": "chat",
        "replica": "r1",
    }
    assert (second["request_id"], second["project"]) == ("b", "team-b")
    assert "node" not in first


def test_a_records_own_fields_are_added() -> None:
    entry = line("GET /v1/models 200", fields={"status": 200, "duration_s": 0.25})
    assert (entry["status"], entry["duration_s"]) == (200, 0.25)
