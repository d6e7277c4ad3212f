"""The Do menu and its dialogs: add a model, create a key, stop or start the cluster, restart agents.

Actions that need what llmgw does not have yet are listed, disabled, with the
reason and what to do instead. A dialog that calls the control plane shows a
refusal in place (what was wrong and what to do), so the input can be fixed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from llmgw.adminapi.schemas import BlobView, KeyCreated, ModelEntry
from llmgw.errors import LlmgwError

ACTIONS: list[tuple[str, str, str]] = [
    ("add-model", "Add a model from a file in the mirror", ""),
    ("add-preset", "Add a model from a preset", "presets are not built yet: upload the file to the mirror"),
    ("create-key", "Create a key", ""),
    ("stop", "Stop the cluster (no replicas, /v1 answers 503)", ""),
    ("start", "Start the cluster (serve again)", ""),
    ("restart-agents", "Restart every node's agent", ""),
    ("add-control-plane", "Add a control plane over SSH", "not built yet: run 'llmgw server add' instead"),
    ("add-node", "Add a node over SSH", "not built yet: run 'llmgw server node-cert' and 'llmgw agent run'"),
    ("wipe", "Wipe the cluster", "not built yet: stop the processes and remove the state directory"),
]
"""The Do menu: (id, what it does, why it is disabled; empty when it is not)."""


class DoMenu(ModalScreen[str | None]):
    """The actions on the cluster; answers the chosen action's id (None: none)."""

    BINDINGS = [("escape", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        options = [
            Option(f"{text}  ({why})" if why else text, id=action, disabled=bool(why))
            for action, text, why in ACTIONS
        ]
        with Vertical(classes="dialog") as box:
            box.border_title = "Do"
            yield OptionList(*options, id="do-actions")

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


class _Form(ModalScreen[Any]):
    """A dialog of inputs with OK and Cancel; ``submit`` calls the control plane."""

    BINDINGS = [("escape", "dismiss(None)", "Cancel")]
    heading = ""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.heading
            yield from self.fields()
            yield Static("", id="problem", classes="problem")
            with Horizontal(classes="buttons"):
                yield Button("OK", id="ok", variant="primary")
                yield Button("Cancel", id="cancel")

    def fields(self) -> ComposeResult:
        raise NotImplementedError

    def value(self, name: str) -> str:
        return self.query_one(f"#{name}", Input).value.strip()

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#ok")
    @on(Input.Submitted)
    async def ok(self) -> None:
        try:
            self.dismiss(await self.submit())
        except LlmgwError as error:
            self.query_one("#problem", Static).update(str(error))

    async def submit(self) -> Any:
        raise NotImplementedError


class AddKeyDialog(_Form):
    """Create a key; answers :class:`KeyCreated` (its secret shown once, after)."""

    heading = "Create a key"

    def __init__(self, create: Callable[[str, str, str], Awaitable[KeyCreated]]) -> None:
        super().__init__()
        self.create = create

    def fields(self) -> ComposeResult:
        yield Label("Name (what the key is for)")
        yield Input(id="name", placeholder="chat-app")
        yield Label("Owner (a label: who uses it)")
        yield Input(id="owner")
        yield Label("Place (project:ORG/TEAM/PROJECT or user:NAME; empty: public models only)")
        yield Input(id="place")

    async def submit(self) -> KeyCreated:
        if not self.value("name"):
            raise LlmgwError("the key needs a name", "type what it is for, e.g. chat-app")
        return await self.create(self.value("name"), self.value("owner"), self.value("place"))


class AddModelDialog(_Form):
    """Add a model served from a GGUF in the mirror; answers :class:`ModelEntry`."""

    heading = "Add a model from the mirror"

    def __init__(self, blobs: list[BlobView], add: Callable[[dict[str, Any]], Awaitable[ModelEntry]]) -> None:
        super().__init__()
        self.blobs = {b.sha256: b for b in blobs if b.filename.endswith(".gguf")}
        self.add = add

    def fields(self) -> ComposeResult:
        yield Label("Name clients ask for")
        yield Input(id="name", placeholder="smollm2-135m-instruct")
        yield Label("Weights (a GGUF in the mirror: 'llmgw mirror upload FILE' adds one)")
        yield Select(
            [(b.filename, b.sha256) for b in self.blobs.values()], id="weights", prompt="choose a file"
        )
        yield Label("Context size (tokens)")
        yield Input("2048", id="ctx_size", type="integer")
        yield Label("Replicas (at least)")
        yield Input("1", id="replicas", type="integer")

    async def submit(self) -> ModelEntry:
        chosen = self.query_one("#weights", Select).value
        if not self.value("name"):
            raise LlmgwError("the model needs a name", "type the name clients will ask for")
        if not isinstance(chosen, str) or chosen not in self.blobs:
            raise LlmgwError("no weights chosen", "choose a GGUF of the mirror")
        blob, count = self.blobs[chosen], int(self.value("replicas") or 1)
        return await self.add(
            {
                "name": self.value("name"),
                "source": {"sha256": blob.sha256, "filename": blob.filename, "size": blob.size},
                "profile": {"ctx_size": int(self.value("ctx_size") or 2048)},
                "replicas": {"min": count, "max": max(count, 1)},
            }
        )


class Message(ModalScreen[None]):
    """Something to read (a key's secret, what an action did), closed with Enter or Escape."""

    BINDINGS = [("escape", "dismiss(None)", "Close"), ("enter", "dismiss(None)", "Close")]

    def __init__(self, heading: str, text: str) -> None:
        super().__init__()
        self.heading, self.text = heading, text

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.heading
            yield Static(self.text, id="message")
            yield Button("Close", id="close", variant="primary")

    @on(Button.Pressed, "#close")
    def close(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    """Yes or no to an action that changes the whole cluster."""

    BINDINGS = [("escape", "dismiss(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = "Are you sure?"
            yield Static(self.question)
            with Horizontal(classes="buttons"):
                yield Button("Yes", id="yes", variant="error")
                yield Button("No", id="no")

    @on(Button.Pressed)
    def answer(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
