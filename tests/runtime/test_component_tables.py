"""Each process's table of components (its wiring module's docstring, and docs/architecture.md) is the
components its code registers on the supervisor: a component added without its row, or a row naming
none, fails here."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "llmgw"
ROW = re.compile(r"^``([a-z][a-z-]*)``\s+(FATAL|RESTART)\b")
RECEIVERS = ("supervisor", "components")
"""How the wiring names the supervisor it registers components on."""


@dataclass(frozen=True)
class ProcessWiring:
    name: str
    table: Path
    """The module whose docstring holds the process's table."""
    registering: tuple[Path, ...]
    """The modules that register its components."""


PROCESSES = [
    ProcessWiring(
        "control plane",
        SRC / "controlplane" / "wiring.py",
        (SRC / "controlplane" / "wiring.py", SRC / "controlplane" / "running.py"),
    ),
    ProcessWiring(
        "gateway worker",
        SRC / "controlplane" / "serving" / "workerserving.py",
        (SRC / "controlplane" / "serving" / "workerserving.py",),
    ),
    ProcessWiring("agent", SRC / "agent" / "running.py", (SRC / "agent" / "running.py",)),
]


def table_rows(docstring: str) -> dict[str, str]:
    """The components a docstring's table names, with their policies."""
    rows: dict[str, str] = {}
    for line in docstring.splitlines():
        if match := ROW.match(line):
            assert match[1] not in rows, f"{match[1]} has two rows"
            rows[match[1]] = match[2]
    return rows


def registered(source: str) -> dict[str, str]:
    """The components a module registers (``supervisor.add("name", ..., Policy.X)``), with their
    policies; every registration must name its component literally, so that none escapes the check."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add"
        ):
            continue
        if not ast.unparse(node.func.value).endswith(RECEIVERS):
            continue
        name = node.args[0] if node.args else None
        assert isinstance(name, ast.Constant) and isinstance(name.value, str), (
            f"a component registered with a name that is not written out: {ast.unparse(node)}"
        )
        policies = [*node.args[2:3], *(k.value for k in node.keywords if k.arg == "policy")]
        fatal = any(ast.unparse(p).endswith("FATAL") for p in policies)
        found[name.value] = "FATAL" if fatal else "RESTART"
    return found


def _differences(table: dict[str, str], code: dict[str, str]) -> list[str]:
    problems = [f"{name} is registered but has no row" for name in code.keys() - table.keys()]
    problems += [f"the row {name} names no component" for name in table.keys() - code.keys()]
    problems += [
        f"{name}: the row says {table[name]}, the code {code[name]}"
        for name in table.keys() & code.keys()
        if table[name] != code[name]
    ]
    return sorted(problems)


def _code_of(process: ProcessWiring) -> dict[str, str]:
    code: dict[str, str] = {}
    for path in process.registering:
        code.update(registered(path.read_text()))
    return code


@pytest.mark.parametrize("process", PROCESSES, ids=lambda p: p.name)
def test_the_table_of_components_in_the_wiring_is_what_the_code_registers(process: ProcessWiring) -> None:
    docstring = ast.get_docstring(ast.parse(process.table.read_text())) or ""
    assert _differences(table_rows(docstring), _code_of(process)) == []


def _architecture_rows() -> dict[str, set[str]]:
    """docs/architecture.md's table of components: per process, the components named (in backticks)."""
    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in {p.name for p in PROCESSES}:
            rows[cells[0]] = set(re.findall(r"`([a-z][a-z-]*)`", cells[2]))
    return rows


def test_the_architecture_docs_name_every_component_of_every_process() -> None:
    rows = _architecture_rows()
    assert set(rows) == {p.name for p in PROCESSES}
    for process in PROCESSES:
        assert rows[process.name] == set(_code_of(process)), process.name


CHECKED = '''"""A process.

=========  ========  ====
component  policy    what
=========  ========  ====
``http``   FATAL     serves
``gone``   RESTART   no longer registered
=========  ========  ====
"""

def wire(supervisor, parts):
    supervisor.add("http", parts.http.serve, Policy.FATAL)
    supervisor.add("new", parts.new.run)
    parts.counts.add("not a component")
'''


def test_the_check_finds_a_component_without_its_row_and_a_row_without_its_component() -> None:
    docstring = ast.get_docstring(ast.parse(CHECKED)) or ""
    assert _differences(table_rows(docstring), registered(CHECKED)) == [
        "new is registered but has no row",
        "the row gone names no component",
    ]


def test_the_check_refuses_a_component_whose_name_is_not_written_out() -> None:
    with pytest.raises(AssertionError, match="not written out"):
        registered("def wire(supervisor, name):\n    supervisor.add(name, run)\n")
