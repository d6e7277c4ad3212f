"""The training environment: keyed by its pins, installed whole or not at all, once per cache."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from llmgw.errors import BuildError
from llmgw.testing.standin_wheels import engine_wheels
from llmgw.training import environment

PINS = ("sglang==0.1.0",)  # a small stand-in wheel: the environment's install, not torch's


def offline(wheels: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(wheels))


def test_the_key_follows_the_pins_whatever_their_order() -> None:
    assert environment.environment_key(["a==1", "b==2"]) == environment.environment_key(["b==2", "a==1"])
    assert environment.environment_key(["a==1"]) != environment.environment_key(["a==2"])
    assert "torch==2.13.0" in environment.REQUIREMENTS


async def test_an_install_is_renamed_into_place_whole_and_found_after(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    engine_wheels(wheels, "sglang", "0.1.0")  # with the torch and sgl-kernel stand-ins it needs
    told: list[str] = []
    python = await environment.install(
        tmp_path, requirements=PINS, say=told.append, pip_arguments=offline(wheels)
    )
    folder = environment.environment_dir(tmp_path, PINS)
    assert python == folder / "venv/bin/python"
    assert json.loads((folder / "environment.json").read_text())["requirements"] == list(PINS)
    assert list(folder.glob("venv/lib/python*/site-packages/sglang/launch_server.py"))  # installed there
    assert any("sglang" in line for line in told) and told[-1] == "training environment installed"
    assert list((tmp_path / "training").glob(".*.partial")) == []
    assert environment.installed_python(tmp_path, PINS) == python
    again: list[str] = []
    assert await environment.install(tmp_path, requirements=PINS, say=again.append) == python
    assert again == []  # found: nothing installed twice


async def test_a_failed_install_leaves_nothing_and_says_pips_last_lines(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no-such-package") as caught:
        await environment.install(
            tmp_path, requirements=("no-such-package==9.9",), pip_arguments=offline(tmp_path)
        )
    assert "package index" in (caught.value.hint or "")
    assert environment.installed_python(tmp_path, ("no-such-package==9.9",)) is None
    assert [p.name for p in (tmp_path / "training").iterdir()] == [".lock"]


async def test_two_installs_at_once_install_once(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    engine_wheels(wheels, "sglang", "0.1.0")  # with the torch and sgl-kernel stand-ins it needs
    told: list[str] = []
    first, second = await asyncio.gather(
        *(
            environment.install(tmp_path, requirements=PINS, say=told.append, pip_arguments=offline(wheels))
            for _ in range(2)
        )
    )
    assert first == second
    assert told.count("creating the training environment") == 1
