"""docs/architecture.md's folder map names every folder and root module of src/llmgw, each once."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "llmgw"


def folder_map_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Folder map", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def test_the_folder_map_names_each_folder_and_root_module_once() -> None:
    folders = {f"{path.name}/" for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    modules = {path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    rows = folder_map_rows()
    assert sorted(rows) == sorted(set(rows)), f"named twice: {sorted({r for r in rows if rows.count(r) > 1})}"
    assert set(rows) == folders | modules
