"""Whether an engine build computes on this node: the verdicts an install reaches, kept in the cache (C4.2).

A node accepts a build only when it computes there (the checks are in
:mod:`llmgw.engines.checking`): llama.cpp answers a token with every layer on
the card, or on a node without NVIDIA cards its CPU build answers a token;
vLLM and SGLang import their compiled extension and torch sees the card;
vLLM's CPU build runs one of its CPU kernels. A build that does not is
refused and the next candidate is tried.

Policy (invariants):

- A verdict holds for the node as it was when it was reached
  (:class:`NodeConditions`: its NVIDIA driver and its cards). While they stay
  the same, a refused build is not tried again — not at every start of the
  agent — and an accepted one is not checked again. A new driver or other
  cards make every verdict stale: the build is checked again.
- The operator forgets the refusals of an engine with
  ``llmgw engine install --retry-refused`` (:func:`forget`); its next install
  tries them again.
- A check that says nothing about the build (``CheckResult.conclusive``
  false: a card's memory was full) reaches no verdict: nothing is kept.
- Accepting a build removes its refusal; each record is written whole
  (temporary file and rename), so a reader never sees half of one.

Layout under the cache directory::

    engines/<engine>/<version>-<variant>/build.json        "check": the verdict it passed
    engines/<engine>/<version>-<variant>.refused.json      the verdict that refused it
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

REFUSED_SUFFIX = ".refused.json"


def retry_hint(engine: str) -> str:
    """How the operator has ``engine``'s refused builds tried again."""
    flag = "" if engine == "llama.cpp" else f" --engine {engine}"
    return f"'llmgw engine install{flag} --retry-refused' tries its refused builds again"


@dataclass(frozen=True)
class CheckResult:
    """What a check found, and the fix when the build does not compute where it should."""

    ok: bool
    found: str
    fix: str = ""
    conclusive: bool = True
    """False when the failure says nothing about the build (a full card): no verdict is kept."""


@dataclass(frozen=True)
class NodeConditions:
    """What a verdict depends on: the node's NVIDIA driver and its cards."""

    driver: str = ""
    cards: tuple[str, ...] = field(default=())
    """Each card's product name (nvidia-smi's ``name``), sorted."""

    @classmethod
    def of(cls, driver_version: str | None, card_names: Iterable[str]) -> NodeConditions:
        cards = tuple(sorted(card_names))
        return cls((driver_version or "") if cards else "", cards)

    @property
    def gpu(self) -> bool:
        """The node has NVIDIA cards: builds must compute on them."""
        return bool(self.cards)

    def __str__(self) -> str:
        if not self.cards:
            return "no NVIDIA card"
        counted = {name: self.cards.count(name) for name in self.cards}
        cards = ", ".join(f"{count}x {name}" for name, count in counted.items())
        return f"driver {self.driver or 'unknown'}; {cards}"


class BuildCheck(Protocol):
    """A check an engine build must pass before an install accepts it on :attr:`node`."""

    @property
    def node(self) -> NodeConditions:
        """The node the check runs on, as its verdicts record it."""
        ...

    async def __call__(self, program: Path, variant: str) -> CheckResult: ...


@dataclass(frozen=True)
class Verdict:
    """A build accepted or refused on this node, and why."""

    engine: str
    build: str
    """The build's key, ``<version>-<variant>``."""
    ok: bool
    found: str
    """What the check saw."""
    fix: str = ""
    node: str = ""
    """:class:`NodeConditions` as text when it was checked."""
    checked_at: str = ""

    def holds(self, node: NodeConditions) -> bool:
        """The verdict was reached on the node as it is now."""
        return self.node == str(node)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Verdict:
        return cls(
            engine=str(record["engine"]),
            build=str(record["build"]),
            ok=bool(record["ok"]),
            found=str(record.get("found", "")),
            fix=str(record.get("fix", "")),
            node=str(record.get("node", "")),
            checked_at=str(record.get("checked_at", "")),
        )


def reach(engine: str, build: str, result: CheckResult, node: NodeConditions) -> Verdict:
    """The verdict ``result`` gives ``build`` on ``node``, now; a refusal's fix says how to retry it."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    fix = result.fix
    if not result.ok:
        fix = "; ".join(part for part in (result.fix, retry_hint(engine)) if part)
    return Verdict(engine, build, result.ok, result.found, fix, str(node), now)


def _write_whole(path: Path, record: dict[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(partial, path)


def refusal_path(cache_dir: Path, engine: str, build: str) -> Path:
    return Path(cache_dir) / "engines" / engine / f"{build}{REFUSED_SUFFIX}"


def refuse(cache_dir: Path, verdict: Verdict) -> Path:
    """Keep ``verdict`` (a refusal) in the cache; the build is not tried again while it holds."""
    path = refusal_path(cache_dir, verdict.engine, verdict.build)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_whole(path, verdict.record())
    return path


def refusal(cache_dir: Path, engine: str, build: str) -> Verdict | None:
    """The refusal kept for ``build``, if any (whether it still holds is :meth:`Verdict.holds`)."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return Verdict.from_record(json.loads(refusal_path(cache_dir, engine, build).read_text()))
    return None


def refusals(cache_dir: Path, engine: str | None = None) -> list[Verdict]:
    """Every refusal kept in the cache (of ``engine`` only, when given), by engine and build."""
    found = []
    for path in sorted(Path(cache_dir).glob(f"engines/{engine or '*'}/*{REFUSED_SUFFIX}")):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            found.append(Verdict.from_record(json.loads(path.read_text())))
    return found


def forget(cache_dir: Path, engine: str, builds: Collection[str] | None = None) -> list[Verdict]:
    """Remove ``engine``'s refusals (of ``builds`` only, when given: the operator asks for them to be
    tried again); what was removed."""
    forgotten = [v for v in refusals(cache_dir, engine) if builds is None or v.build in builds]
    for verdict in forgotten:
        refusal_path(cache_dir, engine, verdict.build).unlink(missing_ok=True)
    return forgotten


def accept(cache_dir: Path, folder: Path, verdict: Verdict) -> None:
    """Write the passing ``verdict`` into the install's ``build.json`` and drop any refusal of it."""
    manifest = folder / "build.json"
    record = json.loads(manifest.read_text())
    record["check"] = verdict.record()
    _write_whole(manifest, record)
    refusal_path(cache_dir, verdict.engine, verdict.build).unlink(missing_ok=True)


def accepted(folder: Path) -> Verdict | None:
    """The verdict an install passed (in its ``build.json``); None for one never checked."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        check = json.loads((folder / "build.json").read_text()).get("check")
        return Verdict.from_record(check) if isinstance(check, dict) and check.get("ok") else None
    return None
