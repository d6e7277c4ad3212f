"""The replica's key file: written whole, 0600, handed to the engine's user; none for a variable."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from llmgw.agent.launching import write_key_file
from llmgw.core.engines import LLAMA_CPP, SGLANG, VLLM
from llmgw.errors import LlmgwError


def test_a_key_file_is_written_0600_in_the_shards_directory(tmp_path: Path) -> None:
    path = write_key_file(tmp_path / "r1", LLAMA_CPP.key_input, "sk-1")

    assert path == tmp_path / "r1" / LLAMA_CPP.key_input.filename
    assert path.read_text() == "sk-1\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file is left beside it"


def test_a_key_file_is_handed_to_the_engines_user(tmp_path: Path) -> None:
    handed: list[tuple[Path, int, int]] = []

    path = write_key_file(
        tmp_path, SGLANG.key_input, "sk-1", (1234, 5678), lambda p, u, g: handed.append((p, u, g))
    )

    assert handed == [(path, 1234, 5678)]


def test_a_key_written_again_replaces_the_file_whole(tmp_path: Path) -> None:
    write_key_file(tmp_path, LLAMA_CPP.key_input, "sk-old")
    path = write_key_file(tmp_path, LLAMA_CPP.key_input, "sk-new")

    assert path is not None and path.read_text() == "sk-new\n"


def test_an_engine_reading_a_variable_gets_no_file(tmp_path: Path) -> None:
    assert write_key_file(tmp_path, VLLM.key_input, "sk-1") is None
    assert list(tmp_path.iterdir()) == []


def test_a_key_file_that_cannot_be_written_says_where_and_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "r1").write_text("a file where the shard's directory should be")

    with pytest.raises(LlmgwError, match=r"cannot write the replica's key file in .*r1.*writable"):
        write_key_file(tmp_path / "r1", LLAMA_CPP.key_input, "sk-1")
