"""Onboarding's steps run on this machine through LocalShell, under a directory of the test's own."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path, PurePosixPath

import pytest

from llmgw.errors import ConfigError
from llmgw.mirror.releases import write_release
from llmgw.operations.onboarding import Installer, Layout, Onboarding, Plan, ReleaseFiles, Service, StepFailed
from llmgw.operations.remote import LocalShell
from llmgw.operations.services import pid_file, start_detached, unit_text
from llmgw.operations.steps import config, install, joined, onboard, room_check
from llmgw.operations.units import UnitPaths, render_unit
from llmgw.pki.signing import generate_signing_key

WHEEL = "llmgw-9.9.9-py3-none-any.whl"


class Ticks:
    """Monotonic time that moves only when slept."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def context(tmp_path: Path, ticks: Ticks | None = None) -> tuple[Onboarding, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []
    ticks = ticks or Ticks()
    ctx = Onboarding(
        LocalShell(),
        lambda step, text: said.append((step, text)),
        Layout(PurePosixPath(tmp_path / "machine")),
        Installer("false"),
        join_timeout_s=5,
        monotonic=ticks.monotonic,
        sleep=ticks.sleep,
    )
    return ctx, said


def release(tmp_path: Path, wheel_bytes: bytes = b"wheel") -> ReleaseFiles:
    """A release signed by a key of the test's; its wheel's bytes as given, whatever was signed."""
    keys = tmp_path / "keys"
    if not keys.exists():
        keys.mkdir()
        generate_signing_key(keys / "release.key", keys / "trusted.pub")
    (tmp_path / WHEEL).write_bytes(b"wheel")
    made = write_release(tmp_path / "release", tmp_path / WHEEL, keys / "release.key")
    files = {
        name: (made.wheel.parent / name).read_bytes() for name in (WHEEL, "SHA256SUMS", "SHA256SUMS.sig")
    }
    files[WHEEL] = wheel_bytes
    return ReleaseFiles("9.9.9", WHEEL, made.sha256, files, (keys / "trusted.pub").read_bytes())


def plan(rel: ReleaseFiles, **changes: object) -> Plan:
    fields: dict[str, object] = {
        "release": rel,
        "files": {"agent.yaml": (b"node_id: n1\n", 0o600)},
        "certificate": "node.crt",
        "certificate_fits": lambda pem: True,
        "issue": lambda: {},
        "service": Service("llmgw-agent", ("agent", "run"), "agent"),
        "joined": lambda: True,
        "joined_what": "n1 registered",
    }
    fields.update(changes)
    return Plan(**fields)  # type: ignore[arg-type]


def test_a_wheel_changed_after_it_was_checked_here_is_refused_on_the_machine(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    with pytest.raises(StepFailed) as raised:
        install(ctx, plan(release(tmp_path, wheel_bytes=b"wheel, altered")))
    assert raised.value.step == "install"
    assert "differs from its sha256" in raised.value.message
    assert not Path(ctx.layout.venv).exists()


def test_sums_signed_by_another_key_are_refused_on_the_machine(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    rel = release(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    generate_signing_key(other / "k", other / "pub")
    forged = ReleaseFiles(rel.version, rel.wheel, rel.sha256, rel.files, (other / "pub").read_bytes())
    with pytest.raises(StepFailed) as raised:
        install(ctx, plan(forged))
    assert "does not verify" in raised.value.message
    assert "trusted.pub" in raised.value.hint


def test_a_signed_release_is_checked_then_handed_to_pip(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)  # python "false": the check passes, then making the venv fails
    with pytest.raises(StepFailed) as raised:
        install(ctx, plan(release(tmp_path)))
    assert raised.value.step == "install" and "package index" in raised.value.hint


def test_configuration_is_written_once(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    assert config(ctx, plan(release(tmp_path))) == "changed: wrote agent.yaml"
    assert config(ctx, plan(release(tmp_path))).startswith("unchanged:")
    assert stat.S_IMODE(Path(ctx.layout.config_dir / "agent.yaml").stat().st_mode) == 0o600


def test_waiting_to_join_asks_until_seen_or_names_the_step_at_the_timeout(tmp_path: Path) -> None:
    ticks = Ticks()
    ctx, _ = context(tmp_path, ticks)
    answers = iter([False, False, True])
    assert joined(ctx, plan(release(tmp_path), joined=lambda: next(answers))) == "ok: n1 registered"
    assert ticks.now == 2.0
    with pytest.raises(StepFailed) as raised:
        joined(ctx, plan(release(tmp_path), joined=lambda: False))
    assert raised.value.step == "join" and "not seen after 5 s" in raised.value.message


def test_an_error_inside_a_step_names_that_step(tmp_path: Path) -> None:
    """(Without the user step: through LocalShell it would change this machine's users.)"""
    ctx, said = context(tmp_path)

    def refuse() -> dict[str, tuple[bytes, int]]:
        raise ConfigError("the CA is missing", "restore ca.key")

    rel = release(tmp_path)
    marker = Path(ctx.layout.marker)
    marker.parent.mkdir(parents=True)
    marker.write_bytes(rel.marker)
    (marker.parent / "bin").mkdir()
    (marker.parent / "bin/llmgw").write_text("")
    with pytest.raises(StepFailed) as raised:
        onboard(ctx, plan(rel, certificate_fits=lambda pem: False, issue=refuse, engine_user=False))
    assert str(raised.value).startswith("localhost: step 'certificate' failed: the CA is missing")
    assert raised.value.hint == "restore ca.key"
    assert [step for step, _ in said] == ["connect", "install"]
    assert said[1][1].startswith("unchanged: llmgw 9.9.9")


def test_the_detached_service_starts_once_and_restarts_when_asked(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    program = Path(ctx.layout.llmgw)
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nwhile :; do sleep 0.1; done\n")
    program.chmod(0o755)
    service = Service("llmgw-agent", ("agent", "run"), "agent")
    pids: list[int] = []
    try:
        assert start_detached(ctx, service, restart=False).startswith("changed: started")
        pids.append(int(Path(pid_file(ctx, service)).read_text()))
        assert start_detached(ctx, service, restart=False).startswith(
            f"unchanged: llmgw-agent runs (pid {pids[0]}"
        )
        assert start_detached(ctx, service, restart=True).startswith("changed: restarted")
        pids.append(int(Path(pid_file(ctx, service)).read_text()))
        assert pids[1] != pids[0]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, os.WNOHANG)
            except (ProcessLookupError, ChildProcessError):
                pass


def test_a_machine_without_room_for_the_mirror_is_refused_before_anything_changes(tmp_path: Path) -> None:
    ctx, _ = context(tmp_path)
    check = room_check("mirror", lambda ctx: ctx.layout.state_dir, 1 << 60, "the mirror's blobs")
    with pytest.raises(StepFailed) as raised:
        check(ctx)
    assert (
        raised.value.step == "mirror" and "the mirror's blobs needs 1073741824.0 GiB" in raised.value.message
    )
    assert "nothing was changed" in raised.value.hint
    assert room_check("mirror", lambda ctx: ctx.layout.state_dir, 1, "blobs")(ctx).startswith(
        "ok: 0.0 GiB needed"
    )
    assert not Path(ctx.layout.state_dir).exists()


@pytest.mark.parametrize("role", ["agent", "server"])
def test_onboarding_writes_the_unit_llmgw_service_install_writes(tmp_path: Path, role: str) -> None:
    ctx, _ = context(tmp_path)
    layout = ctx.layout
    paths = UnitPaths(str(layout.llmgw), str(layout.config_dir), str(layout.state_dir))
    text = unit_text(ctx, Service(f"llmgw-{role}", (role, "run"), role)).decode()
    assert text == render_unit(role, paths)
    if role == "agent":  # engines outlive a restart of the agent's unit
        assert "KillMode=process" in text and "--keep-engines" in text
