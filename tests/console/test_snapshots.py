"""How the console looks, drawn from fixed data (pytest-textual-snapshot; ``--snapshot-update`` redraws)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from llmgw.console.app import ConsoleApp
from llmgw.console.setup import SetupScreen
from llmgw.testing.eventually import eventually

from .fixtures import NOW, FixedSource

SIZE = (140, 36)


def loaded_on(*keys: str):  # type: ignore[no-untyped-def]
    """Before the picture: every streamed kind in, then ``keys`` pressed and what they fetch in."""

    async def run_before(pilot: Pilot[None]) -> None:
        app: Any = pilot.app
        await eventually(lambda: app.data.keys, message="every streamed kind arrived")
        for key in keys:
            await pilot.press(key)
        await eventually(lambda: all(getattr(app.data, kind) for kind in app.current.needs))
        await pilot.pause()

    return run_before


def test_overview(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(FixedSource(), now=lambda: NOW), terminal_size=SIZE, run_before=loaded_on()
    )


def test_gpus(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(FixedSource(), now=lambda: NOW), terminal_size=SIZE, run_before=loaded_on("3")
    )


def test_replicas(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(FixedSource(), now=lambda: NOW), terminal_size=SIZE, run_before=loaded_on("5")
    )


def test_keys_and_usage(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(FixedSource(), now=lambda: NOW), terminal_size=SIZE, run_before=loaded_on("8")
    )


def test_do_menu(snap_compare: Any) -> None:
    assert snap_compare(
        ConsoleApp(FixedSource(), now=lambda: NOW), terminal_size=SIZE, run_before=loaded_on("d")
    )


def test_setup(snap_compare: Any) -> None:
    app = ConsoleApp(setup=(SetupScreen(Path("/srv/llmgw")), lambda choices: FixedSource()), now=lambda: NOW)

    async def run_before(pilot: Pilot[None]) -> None:
        await eventually(lambda: isinstance(pilot.app.screen, SetupScreen))
        pilot.app.screen.query_one("#node_id").value = "gpu1"  # type: ignore[attr-defined]
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
