"""The console: one frame with a title bar, a sidebar of views, a bordered panel, a status line and a key bar.

The views draw from :class:`~llmgw.console.state.ClusterData`, which the
source's updates (``/api/events``, or polling) keep current; kinds the stream
does not carry are fetched when their view is shown, on ``r``, and every
:data:`REFRESH_S` seconds while shown. ``d`` opens the Do menu: what goes
through the admin API, and what the commands do to machines (adding a node
or a control plane over SSH, wiping this one, adding a preset), each asked
first and shown step by step (:mod:`llmgw.console.operations`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import ContentSwitcher, Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from llmgw.console.dialogs import (
    AddControlPlaneDialog,
    AddKeyDialog,
    AddModelDialog,
    AddNodeDialog,
    AddPresetDialog,
    Confirm,
    DoMenu,
    Message,
    Running,
    WipeDialog,
)
from llmgw.console.events import Event, Notice
from llmgw.console.operations import AdminClient, Prepared, Ssh
from llmgw.console.overview import OverviewView
from llmgw.console.setup import SetupChoices, SetupScreen, start_commands
from llmgw.console.source import AdminSource, ClusterSource
from llmgw.console.state import ClusterData
from llmgw.console.views import (
    BatchesView,
    GpusView,
    KeysView,
    MirrorView,
    ModelsView,
    NodesView,
    ReplicasView,
    SettingsView,
    TrainingView,
)
from llmgw.errors import LlmgwError

REFRESH_S = 5.0
"""How often the shown view's fetched kinds (GPU readings, the mirror, training jobs, batches,
history, usage) are asked again."""

VIEWS: list[tuple[str, type[Widget]]] = [
    ("overview", OverviewView),
    ("nodes", NodesView),
    ("gpus", GpusView),
    ("models", ModelsView),
    ("replicas", ReplicasView),
    ("mirror", MirrorView),
    ("settings", SettingsView),
    ("keys", KeysView),
    ("training", TrainingView),
    ("batches", BatchesView),
]

CSS = """
#sidebar { width: 22; height: 100%; border: round $primary; }
#panel { border: round $accent; padding: 0 1; }
#statusline { height: 1; padding: 0 1; background: $boost; }
#statusline.trouble { color: $error; }
.table-label { text-style: bold; margin-top: 1; }
SettingsView DataTable, KeysView DataTable { height: auto; max-height: 50%; }
ModalScreen { align: center middle; }
.dialog {
    width: 80; height: auto; max-height: 90%; border: thick $primary; padding: 1 2; background: $surface;
}
.dialog OptionList { height: auto; }
.buttons { height: auto; margin-top: 1; }
.buttons Button { margin-right: 2; }
.problem { color: $error; height: auto; }
.dialog .row { height: auto; }
.dialog .field { height: auto; width: 1fr; margin-right: 1; }
.dialog Log { height: auto; max-height: 20; }
SetupScreen .row { height: auto; }
SetupScreen .field { height: auto; width: 1fr; margin-right: 1; }
"""


class ConsoleApp(App[None]):
    TITLE = "llmgw console"
    CSS = CSS
    BINDINGS = [
        Binding("d", "do", "Do…"),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "quit", "Quit"),
        *(
            Binding(str(n % 10), f"view('{key}')", key.title(), show=False)
            for n, (key, _) in enumerate(VIEWS, 1)
        ),
    ]

    def __init__(
        self,
        source: ClusterSource | None = None,
        *,
        setup: tuple[SetupScreen, Callable[[SetupChoices], ClusterSource]] | None = None,
        now: Callable[[], float] = time.time,
        refresh_s: float = REFRESH_S,
        ssh: Ssh | None = None,
    ) -> None:
        """The console of ``source``; without one, ``setup`` first (its screen, and how to reach
        the cluster it creates). ``ssh``: what the add-node and add-control-plane dialogs start from
        (the commands' defaults)."""
        super().__init__()
        self.ssh = ssh or Ssh()
        self._source = source
        self.setup = setup
        self.now = now
        self.refresh_s = refresh_s
        self.data = ClusterData()
        self.notice = Notice("connecting…")

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≡")
        with Horizontal():
            yield OptionList(
                *(Option(f"{n} {view.title}", id=key) for n, (key, view) in enumerate(VIEWS, 1)),  # type: ignore[attr-defined]
                id="sidebar",
            )
            with Vertical(id="panel"), ContentSwitcher(initial="overview", id="views"):
                for key, view in VIEWS:
                    yield view(id=key)
        yield Static(self.notice.text, id="statusline")
        yield Footer()

    @property
    def source(self) -> ClusterSource:
        if self._source is None:
            raise LlmgwError("no cluster yet", "finish the setup first")
        return self._source

    def on_mount(self) -> None:
        self.action_view("overview")
        self.set_interval(self.refresh_s, self.action_refresh)
        if self._source is not None:
            self.connect(self._source)
        elif self.setup is not None:
            self.push_screen(self.setup[0], self.set_up)

    def connect(self, source: ClusterSource) -> None:
        self._source = source
        self.sub_title = source.name
        self.listen()

    def set_up(self, choices: SetupChoices | None) -> None:
        if choices is not None:
            self.open_cluster(choices)

    @work
    async def open_cluster(self, choices: SetupChoices) -> None:
        """Say how to start the new cluster, then show it."""
        assert self.setup is not None
        text = f"Created in {choices.directory}. Start it with:\n\n{start_commands(choices)}"
        await self.push_screen_wait(Message("Cluster created", text))
        self.connect(self.setup[1](choices))

    # data

    @work(exclusive=True, group="updates")
    async def listen(self) -> None:
        async for update in self.source.updates():
            if isinstance(update, Notice):
                self.say(update)
                continue
            self.take(update)

    def take(self, event: Event) -> None:
        try:
            self.data.apply(event.kind, event.data)
        except LlmgwError as error:
            self.say(Notice(str(error), trouble=True))
            return
        self.redraw()

    def redraw(self) -> None:
        for key, _ in VIEWS:
            self.query_one(f"#{key}").show(self.data, self.now())  # type: ignore[attr-defined]

    def say(self, notice: Notice) -> None:
        self.notice = notice
        line = self.query_one("#statusline", Static)
        line.update(notice.text)
        line.set_class(notice.trouble, "trouble")

    @work(group="fetch")
    async def fetch(self, kinds: tuple[str, ...]) -> None:
        for kind in kinds:
            try:
                self.data.apply(kind, await self.source.fetch(kind))
            except LlmgwError as error:
                self.say(Notice(f"cannot show {kind}: {error}", trouble=True))
                return
        self.redraw()

    # navigation and actions

    @property
    def current(self) -> Any:
        return self.query_one(f"#{self.query_one(ContentSwitcher).current}")

    def action_view(self, key: str) -> None:
        self.query_one(ContentSwitcher).current = key
        view = self.current
        self.query_one("#panel").border_title = view.title
        sidebar = self.query_one("#sidebar", OptionList)
        sidebar.highlighted = sidebar.get_option_index(key)
        view.show(self.data, self.now())
        if self._source is not None and view.needs:
            self.fetch(view.needs)

    @on(OptionList.OptionHighlighted, "#sidebar")
    def picked(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id and event.option.id != self.query_one(ContentSwitcher).current:
            self.action_view(event.option.id)

    def action_refresh(self) -> None:
        if self._source is not None and self.current.needs:
            self.fetch(self.current.needs)

    @property
    def admin(self) -> AdminClient | None:
        """The admin client uploads and presets go through (None: a source without one)."""
        return self._source.client if isinstance(self._source, AdminSource) else None

    @work
    async def action_do(self) -> None:
        chosen = await self.push_screen_wait(DoMenu())
        try:
            await self.act(chosen)
        except LlmgwError as error:
            await self.push_screen_wait(Message("The control plane refused", str(error)))

    async def act(self, chosen: str | None) -> None:
        if chosen == "create-key":
            created = await self.push_screen_wait(AddKeyDialog(self.source.create_key))
            if created is not None:
                text = (
                    f"{created.name} ({created.id}):\n\n{created.key}\n\nIt is shown this once: keep it now."
                )
                await self.push_screen_wait(Message("Key created", text))
        elif chosen == "add-model":
            self.data.apply("blobs", await self.source.fetch("blobs"))
            entry = await self.push_screen_wait(
                AddModelDialog(self.data.blobs, self.source.add_model, self.admin)
            )
            if entry is not None:
                self.say(Notice(f"added model {entry.name}: its replicas start on nodes with room"))
        elif chosen in ("stop", "start"):
            stop = chosen == "stop"
            question = (
                "Stop the cluster? Every replica stops and /v1 answers 503." if stop else "Serve again?"
            )
            if await self.push_screen_wait(Confirm(question)):
                self.data.apply("serving", (await self.source.set_serving(stop)).model_dump())
                self.redraw()
        elif chosen == "restart-agents":
            if await self.push_screen_wait(Confirm("Restart every node's agent? Engines keep running.")):
                answer = await self.source.restart_agents("llmgw console")
                self.say(Notice(f"asked to restart: {', '.join(answer.restarted) or 'no node connected'}"))
        elif chosen in ("add-preset", "add-node", "add-control-plane", "wipe"):
            await self.operate(await self.push_screen_wait(self.form(chosen)))

    def form(self, chosen: str) -> AddPresetDialog | AddNodeDialog | AddControlPlaneDialog | WipeDialog:
        if chosen == "add-preset":
            return AddPresetDialog(self.admin)
        if chosen == "add-node":
            return AddNodeDialog(self.ssh)
        if chosen == "add-control-plane":
            return AddControlPlaneDialog(self.ssh)
        return WipeDialog()

    async def operate(self, prepared: Prepared | None) -> None:
        """Ask, then run it, showing each step and the result."""
        if prepared is None or not await self.push_screen_wait(Confirm(prepared.question, prepared.typed)):
            return
        result = await self.push_screen_wait(Running(prepared))
        if result:
            self.say(Notice(result))
