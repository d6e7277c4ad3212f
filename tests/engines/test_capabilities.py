"""One table of engines: every row has its module, and nothing else in llmgw names an engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llmgw
from llmgw.core import engines as table
from llmgw.core.engines import ENGINE_NAMES, ENGINES, EngineCapabilities
from llmgw.engines.registry import ENGINES as REGISTRY
from llmgw.engines.registry import engine_named

SOURCE = Path(llmgw.__file__).parent
ALLOWED = (SOURCE / "engines", SOURCE / "testing", Path(table.__file__))
"""Where engine names may be written: the engine modules, the table, and the stand-ins for engines."""


def test_every_row_has_an_engine_module_and_every_module_a_row() -> None:
    assert list(REGISTRY) == list(ENGINE_NAMES)


@pytest.mark.parametrize("row", ENGINES, ids=ENGINE_NAMES)
def test_each_engine_object_points_at_its_row(row: EngineCapabilities) -> None:
    engine = engine_named(row.name)
    assert engine.capabilities is row
    assert (engine.name, engine.health_path, engine.metrics_path) == (
        row.name,
        row.health_path,
        row.metrics_path,
    )


def test_an_empty_engine_name_is_the_default_engine() -> None:
    assert engine_named("").capabilities is table.find_engine("")


def engine_literals(path: Path) -> list[str]:
    """``file:line: 'name'`` for each string constant of ``path`` that is an engine's name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(SOURCE)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ENGINE_NAMES
    ]


def test_no_module_outside_the_engines_and_their_table_names_an_engine() -> None:
    found = [
        hit
        for path in sorted(SOURCE.rglob("*.py"))
        if not any(path == allowed or allowed in path.parents for allowed in ALLOWED)
        for hit in engine_literals(path)
    ]
    assert found == [], "ask llmgw.core.engines (a capability of the engine's row) instead of its name"


def test_the_walk_finds_a_literal_where_there_is_one() -> None:
    sample = SOURCE / "core" / "engines.py"
    assert engine_literals(sample), "the table names every engine, so the walk must see them"
