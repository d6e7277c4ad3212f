"""What the commands print: tables, errors, logging."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from pydantic_core import to_jsonable_python
from rich.console import Console
from rich.markup import escape as markup_escape
from rich.table import Table

from llmgw.core.filenames import escaped
from llmgw.errors import LlmgwError, ValidationFailed
from llmgw.observability import logcontext

console = Console()
errors = Console(stderr=True)


def fail(error: LlmgwError) -> NoReturn:
    errors.print(f"[bold red]error:[/] {error.message}", highlight=False)
    if isinstance(error, ValidationFailed):
        for field, problem in error.problems:
            errors.print(f"  - {field or '(definition)'}: {problem}", highlight=False)
    if error.hint:
        errors.print(f"[bold]what to do:[/] {error.hint}", highlight=False)
    sys.exit(2 if error.status in (400, 404, 409) else 1)


def shown(text: object) -> str:
    """Text a client gave (a file's name, an audit entry's target) as a table or a line prints it:
    control characters written as escapes (``\\x1b``), so they never act on the terminal, and Rich's
    ``[...]`` markup taken as plain text."""
    return markup_escape(escaped(str(text)))


def _cell(value: object) -> str:
    """A table's cell: control characters other than a line break escaped, whatever the column."""
    if value is None:
        return ""
    return "\n".join(escaped(line) for line in str(value).split("\n"))


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> None:
    out = Table(title=title, show_edge=False, header_style="bold")
    for column in columns:
        out.add_column(column)
    for row in rows:
        out.add_row(*(_cell(value) for value in row))
    console.print(out)


def print_json(value: Any) -> None:
    """Print ``value`` (models, lists of them, plain data) as indented JSON on stdout, nothing else."""
    sys.stdout.write(json.dumps(to_jsonable_python(value, by_alias=True), indent=2) + "\n")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message; the context's fields where set
    (request id, project, model, replica, node: :mod:`llmgw.observability.logcontext`); a record's
    own ``fields`` (``extra={"fields": {...}}``, as the access log gives); the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(logcontext.fields())
        own = getattr(record, "fields", None)
        if isinstance(own, dict):
            entry.update(own)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str = "info", as_json: bool = False) -> None:
    handler = logging.StreamHandler()
    if as_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiosqlite", "sqlalchemy.engine", "alembic", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
