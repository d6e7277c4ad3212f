"""Every ``llmgw`` command a hint, an error or a page of docs/ names exists.

Collected: in src, ``llmgw ctl ...`` in any string, and ``llmgw X ...`` in a
string passed to a raised error or as a ``hint``, or quoted (in single quotes
or backticks) in any string; in docs/*.md and README.md, code spans and lines
of code blocks that start with ``llmgw`` (or ``ctl``, short for ``llmgw
ctl``). Each is walked down the command tree (its words up to the first that is not one:
a placeholder, an option, a path), then its command path is run with
``--help`` through Typer's runner.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import typer
from typer import _click as click  # the click Typer ships and builds on
from typer.core import TyperGroup
from typer.testing import CliRunner

from llmgw.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "src" / "llmgw"
DOCS = ROOT / "docs"

WORD = re.compile(r"[a-z][a-z0-9-]*")
MENTION = re.compile(r"(?<![\w./-])llmgw (?=[a-z])")
SPAN = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Named:
    """One command named somewhere: its words after ``llmgw``, and where."""

    words: tuple[str, ...]
    place: str
    strict: bool
    """Its first word must be a command (quoted, in docs); else a first word that is none is prose."""


def command_words(text: str) -> tuple[str, ...]:
    """The leading words of ``text`` that could be command names (up to a placeholder, option, path)."""
    words: list[str] = []
    for token in text.split():
        match = WORD.match(token)
        if match is None:
            break
        words.append(match.group())
        if match.end() != len(token):  # "agent," or "kb's": the sentence goes on, the command ends
            break
    return tuple(words)


def _strings(tree: ast.AST) -> Iterator[tuple[ast.AST, str, bool]]:
    """Each string in ``tree`` (an f-string's parts joined), and whether it is an error's or a hint."""
    told: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            told.update(id(part) for arg in node.exc.args for part in ast.walk(arg))
            told.update(id(part) for kw in node.exc.keywords for part in ast.walk(kw.value))
        if isinstance(node, ast.keyword) and node.arg == "hint":
            told.update(id(part) for part in ast.walk(node.value))
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            yield node, node.value, id(node) in told
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
            yield node, text, id(node) in told


def named_in_sources() -> Iterator[Named]:
    for path in sorted(SOURCES.rglob("*.py")):
        if "_pb2" in path.name:
            continue
        relative = path.relative_to(ROOT)
        for node, text, told in _strings(ast.parse(path.read_text(), str(path))):
            place = f"{relative}:{getattr(node, 'lineno', 0)}"
            for match in MENTION.finditer(text):
                after = text[match.end() :]
                quoted = match.start() > 0 and text[match.start() - 1] in "'`"
                if quoted or after.startswith("ctl "):
                    yield Named(command_words(after), place, strict=True)
                elif told:
                    yield Named(command_words(after), place, strict=False)


def named_in_docs() -> Iterator[Named]:
    for path in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        relative = path.relative_to(ROOT)
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            place = f"{relative}:{number}"
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                candidates = [re.sub(r"^\s*(?:\$ |\S*/bin/)?", "", line)]
            else:
                candidates = SPAN.findall(line)
            for text in candidates:
                text = text.strip()
                if text.startswith("ctl "):
                    text = f"llmgw {text}"
                if text.startswith("llmgw ") and (words := command_words(text.removeprefix("llmgw "))):
                    yield Named(words, place, strict=True)


def resolved(root: TyperGroup, words: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The command path ``words`` names, and why a word is no command (empty: it is one)."""
    command: click.Command = root
    path: list[str] = []
    for word in words:
        if not isinstance(command, TyperGroup):
            break  # a command's arguments follow it
        sub = command.get_command(click.Context(command), word)
        if sub is None:
            where = " ".join(["llmgw", *path])
            known = ", ".join(command.list_commands(click.Context(command)))
            return tuple(path), f"{where} has no command {word!r} (it has: {known})"
        command = sub
        path.append(word)
    return tuple(path), ""


def test_every_command_named_in_hints_errors_and_docs_exists() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    top = set(root.list_commands(click.Context(root)))
    named = [n for n in (*named_in_sources(), *named_in_docs()) if n.words]
    missing: list[str] = []
    paths: dict[tuple[str, ...], str] = {}
    for item in named:
        if not item.strict and item.words[0] not in top:
            continue  # prose: "llmgw writes the key", not a command
        path, why = resolved(root, item.words)
        if why:
            missing.append(f"{item.place}: 'llmgw {' '.join(item.words)}': {why}")
        else:
            paths.setdefault(path, item.place)
    assert not missing, "commands that do not exist:\n" + "\n".join(missing)
    assert len(paths) > 50  # the collection found the commands the docs and hints name
    runner = CliRunner()
    failed = []
    for path, place in sorted(paths.items()):
        answer = runner.invoke(app, [*path, "--help"])
        if answer.exit_code != 0:
            failed.append(
                f"{place}: 'llmgw {' '.join(path)} --help' exited {answer.exit_code}: {answer.output}"
            )
    assert not failed, "\n".join(failed)
