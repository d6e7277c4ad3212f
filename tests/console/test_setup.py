"""Setup on a machine with no cluster: server init and the first node in the console's frame."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, Static

from llmgw.agent.config import load_agent_config
from llmgw.cli.console import needs_setup
from llmgw.console.app import ConsoleApp
from llmgw.console.dialogs import Message
from llmgw.console.setup import SetupChoices, SetupScreen
from llmgw.controlplane.config import load_server_config
from llmgw.testing.eventually import eventually

from .fixtures import NOW, FixedSource

SIZE = (160, 40)


def test_an_empty_home_with_no_context_needs_setup(tmp_path: Path) -> None:
    empty = {
        "HOME": str(tmp_path),
        "LLMGW_HOME": str(tmp_path / "up"),
        "LLMGW_CLIENT_CONFIG": str(tmp_path / "c.yaml"),
    }
    assert needs_setup(None, None, empty)
    assert not needs_setup("http://cp1:8080", None, empty)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "server.yaml").write_text("name: cp1\n")
    assert not needs_setup(None, None, empty)


async def test_setup_on_an_empty_home_creates_the_cluster_and_its_first_node_then_opens_the_console(
    tmp_path: Path,
) -> None:
    home = tmp_path / "up"
    reached: list[SetupChoices] = []

    def reach(choices: SetupChoices) -> FixedSource:
        reached.append(choices)
        return FixedSource()

    app = ConsoleApp(setup=(SetupScreen(home), reach), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await eventually(lambda: isinstance(app.screen, SetupScreen) and app.screen.query("#create"))
        app.screen.query_one("#node_id", Input).value = "gpu1"
        app.screen.query_one("#http_port", Input).value = "18080"
        await pilot.pause()
        await pilot.click("#create")
        await eventually(lambda: isinstance(app.screen, Message), timeout_s=30, message="setup is done")
        said = str(app.screen.query_one("#message", Static).render())
        await pilot.press("escape")
        await eventually(lambda: app.data.keys, message="the console shows the new cluster")
    config = load_server_config(home / "server.yaml")
    assert (config.name, config.http.port) == ("cp1", 18080)
    assert (home / "admin.token").exists()
    agent = load_agent_config(home / "agent" / "agent.yaml")
    assert (agent.node_id, agent.control_planes) == ("gpu1", ["127.0.0.1:8443"])
    assert (home / "agent" / "node.crt").exists()
    assert f"llmgw server run --config {home / 'server.yaml'}" in said
    assert reached == [SetupChoices(home, "cp1", 18080, 8443, "gpu1")]


async def test_setup_where_a_cluster_exists_says_so_and_stays(tmp_path: Path) -> None:
    home = tmp_path / "up"
    home.mkdir()
    (home / "server.yaml").write_text("name: cp1\n")
    app = ConsoleApp(setup=(SetupScreen(home), lambda choices: FixedSource()), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await eventually(lambda: isinstance(app.screen, SetupScreen) and app.screen.query("#create"))
        await pilot.pause()
        await pilot.click("#create")
        problem = app.screen.query_one("#problem", Static)
        await eventually(lambda: "already exists" in str(problem.render()))
        assert isinstance(app.screen, SetupScreen)
