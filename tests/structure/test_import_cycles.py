"""No import cycle between llmgw's modules, type-only imports and imports inside functions included.

A cycle is one of design even when Python can load it (an import under
``TYPE_CHECKING``, or one moved into a function so the module loads): the two
modules cannot be understood, tested or moved apart. The check reads the
import graph with grimp (import-linter's graph library): a pair of modules is
on a cycle when one imports the other directly and an import chain leads
back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest

REMAINING: dict[tuple[str, str], str] = {}
"""Cycles known and to be removed (none today); the list only shrinks."""


def pairs_on_cycles(graph: grimp.ImportGraph) -> dict[tuple[str, str], tuple[str, ...]]:
    """Every pair of modules on a cycle (sorted names), with the chain that closes it."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            pair = (min(importer, imported), max(importer, imported))
            if pair in found:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                found[pair] = (importer, *back)
    return found


def llmgw_graph() -> grimp.ImportGraph:
    return grimp.build_graph("llmgw", exclude_type_checking_imports=False, cache_dir=None)


def test_no_new_import_cycle_between_llmgw_modules() -> None:
    new = {pair: chain for pair, chain in pairs_on_cycles(llmgw_graph()).items() if pair not in REMAINING}
    assert not new, (
        "import cycles:\n"
        + "\n".join(" -> ".join(chain) for chain in new.values())
        + ("\nbreak each: move what both need into a module below them, or depend on a protocol there")
    )


def test_every_remaining_cycle_is_still_there() -> None:
    gone = sorted(set(REMAINING) - set(pairs_on_cycles(llmgw_graph())))
    assert not gone, f"no longer on a cycle, remove from REMAINING: {gone}"


def test_type_only_and_function_local_imports_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "cyclic"
    package.mkdir()
    files = {
        "__init__.py": "",
        "repository.py": "import typing\nif typing.TYPE_CHECKING:\n    from cyclic.store import Store\n",
        "store.py": "from cyclic.repository import *\n",
        "routes.py": "from cyclic.state import *\n",
        "state.py": "def build():\n    from cyclic.routes import build\n",
        "below.py": "",
        "above.py": "from cyclic.below import *\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cyclic", raising=False)

    found = pairs_on_cycles(grimp.build_graph("cyclic", exclude_type_checking_imports=False, cache_dir=None))

    assert sorted(found) == [("cyclic.repository", "cyclic.store"), ("cyclic.routes", "cyclic.state")]
    assert found[("cyclic.repository", "cyclic.store")] == (
        "cyclic.repository",
        "cyclic.store",
        "cyclic.repository",
    )
