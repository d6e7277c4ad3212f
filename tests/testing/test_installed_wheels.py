"""Wheels packed again from installed distributions: the closure of requirements, each wheel whole."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from llmgw.errors import LlmgwError
from llmgw.testing.installed_wheels import closure, pack, wheelhouse


def test_the_closure_follows_requirements_extras_and_markers() -> None:
    names = [
        dist.metadata["Name"].lower()
        for dist in closure(["sqlalchemy[asyncio]", "nothing; python_version < '3'"])
    ]
    assert "sqlalchemy" in names and "greenlet" in names and "nothing" not in names
    assert "greenlet" not in [d.metadata["Name"].lower() for d in closure(["sqlalchemy"])]


def test_a_requirement_not_installed_is_named() -> None:
    with pytest.raises(LlmgwError, match="no-such-distribution is not installed"):
        closure(["no-such-distribution"])


def test_a_packed_wheel_holds_the_files_its_record_lists_with_their_hashes(tmp_path: Path) -> None:
    (wheel,) = wheelhouse(["shellingham"], tmp_path)
    assert wheel.name.startswith("shellingham-") and wheel.name.endswith("-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        (record_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        for name, digest, size in rows:
            if name == record_name:
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))
        names = {row[0] for row in rows}
    assert "shellingham/__init__.py" in names and record_name.replace("RECORD", "METADATA") in names
    assert not any(n.endswith((".pyc", "INSTALLER", "direct_url.json")) for n in names)
    assert pack(closure(["shellingham"])[0], tmp_path) == wheel  # kept, not packed again
