"""``llmgw ctl usage``: usage as a table, JSON or CSV, through a real admin API over a store that
holds usage rows."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from llmgw.adminapi.usage import UsageAnswer
from llmgw.cli.main import app
from llmgw.store.database import Store
from llmgw.store.usage import UsageEntry, UsageLog

from .conftest import AdminServer

CHAT = "project:acme/ml/chat"


def run(server: AdminServer, *args: str, code: int = 0) -> tuple[str, str]:
    answer = CliRunner().invoke(app, ["ctl", "usage", *args, *server.options()], env={"COLUMNS": "200"})
    assert answer.exit_code == code, answer.output
    return answer.stdout, answer.stderr


def day(number: int, hour: int) -> datetime:
    return datetime(2026, 3, number, hour, tzinfo=UTC)


def used(tmp_path: Path) -> None:
    """Rows in the admin server's store (the same SQLite file)."""

    async def write() -> None:
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
        try:
            await UsageLog(store).append(
                [
                    UsageEntry(day(1, 9), "k1", "llama", 2, 0, 20, 40, 900, CHAT,
                               streamed=2, ttft_ms=300, generation_ms=2000, cached_tokens=8, cost=0.0125),
                    UsageEntry(day(1, 14), "k2", "embed", 3, 1, 30, 0, 900, "user:ann"),
                    UsageEntry(day(1, 14), "k2", "embed", 1, 1, 0, 0, 1, "user:ann", refused=429),
                    UsageEntry(day(2, 9), "k1", "llama", 1, 0, 10, 20, 900, CHAT, cost=0.005),
                ]
            )  # fmt: skip
        finally:
            await store.close()

    asyncio.run(write())


def test_json_is_the_apis_answer(admin_server: AdminServer, tmp_path: Path) -> None:
    used(tmp_path)
    out, _ = run(admin_server, "--group-by", "project,model", "--by", "day", "--json")
    answer = UsageAnswer.model_validate(json.loads(out))
    assert answer.group_by == ["project", "model"]
    assert [(line.start.day, line.project, line.model, line.requests) for line in answer.lines] == [
        (1, CHAT, "llama", 2),
        (1, "user:ann", "embed", 4),
        (2, CHAT, "llama", 1),
    ]
    assert (answer.lines[0].ttft_mean_ms, answer.lines[0].tokens_per_s) == (150.0, 20.0)


def test_from_and_to_bound_the_answer(admin_server: AdminServer, tmp_path: Path) -> None:
    used(tmp_path)
    out, _ = run(admin_server, "--by", "hour", "--from", "2026-03-01T10:00Z", "--to", "2026-03-02", "--json")
    assert [(line.start.hour, line.model) for line in UsageAnswer.model_validate(json.loads(out)).lines] == [
        (14, "embed")
    ]


def test_a_table_by_default(admin_server: AdminServer, tmp_path: Path) -> None:
    used(tmp_path)
    out, _ = run(admin_server, "-g", "model", "--by", "month")
    lines = [line.replace("┃", " ").replace("│", " ") for line in out.splitlines() if line.strip()]
    header, *rows = [line.split() for line in lines if "━" not in line and "─" not in line]
    assert header[:2] == ["START", "MODEL"]
    assert rows == [
        ["2026-03", "embed", "4", "2", "429:1", "30", "0", "0", "0.000000", "-", "-"],
        ["2026-03", "llama", "3", "0", "-", "30", "8", "60", "0.017500", "150", "20.0"],
        ["TOTAL", "7", "2", "60", "8", "60", "0.017500"],
    ]
    assert "COST (USD)" in " ".join(header)


def test_csv_is_printed_whole_and_a_cut_answer_is_told_on_stderr(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    used(tmp_path)
    out, err = run(admin_server, "--group-by", "key", "--csv", "--limit", "1")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0][:3] == ["start", "key", "key_name"]
    assert len(rows) == 2
    assert "left out" in err


def test_an_unknown_dimension_is_refused_naming_the_known_ones(admin_server: AdminServer) -> None:
    answer = CliRunner().invoke(
        app, ["ctl", "usage", "--group-by", "colour", *admin_server.options()], env={"COLUMNS": "200"}
    )
    assert answer.exit_code != 0
    assert "key, project, team, org, model" in answer.output
