"""The firewall component: a part applied when it changes, carrying on without nft (C10.2)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from llmgw.operations.firewall import FirewallPart, agent_part
from llmgw.operations.firewallkeeping import FirewallKeeper, addresses, agent_source, host_of
from llmgw.operations.nftables import Completed, FirewallError, FirewallState, Nft, sync
from llmgw.testing.clock import FakeClock


class RecordingNft:
    """Stands in for the nft program: records each command and its input."""

    def __init__(self, returncode: int = 0, stderr: str = "", table: str = "") -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.returncode = returncode
        self.stderr = stderr
        self.table = table

    def __call__(self, argv: Sequence[str], stdin: str) -> Completed:
        self.calls.append((list(argv), stdin))
        if argv[1:3] == ["list", "table"]:
            return Completed(0 if self.table else 1, self.table, "")
        return Completed(self.returncode, "", self.stderr)

    def applied(self) -> list[str]:
        return [stdin for argv, stdin in self.calls if argv[1:] == ["-f", "-"]]


def _nft(runner: RecordingNft, installed: bool = True) -> Nft:
    return Nft(runner=runner, which=lambda name: f"/usr/sbin/{name}" if installed else None)


def _part(control_planes: list[str], enabled: bool = True) -> FirewallPart:
    return agent_part(
        "n1", enabled=enabled, address="10.0.0.2", ports=(21000, 21999), control_planes=control_planes
    )


class Parts:
    def __init__(self, part: FirewallPart) -> None:
        self.part = part

    async def __call__(self) -> FirewallPart:
        return self.part


async def test_a_part_is_written_and_applied_once_until_it_changes(tmp_path: Path) -> None:
    runner = RecordingNft()
    parts = Parts(_part(["10.0.0.1"]))
    keeper = FirewallKeeper(parts, FirewallState(tmp_path), _nft(runner), clock=FakeClock())
    await keeper.once()
    await keeper.once()
    assert len(runner.applied()) == 1
    assert "ip saddr { 10.0.0.1 } accept" in runner.applied()[0]
    assert (tmp_path / "agent-n1.json").exists()

    parts.part = _part(["10.0.0.1", "10.0.0.5"])  # a control plane joined
    await keeper.once()
    assert len(runner.applied()) == 2
    assert "ip saddr { 10.0.0.1, 10.0.0.5 } accept" in runner.applied()[1]


async def test_turning_the_firewall_off_removes_the_table(tmp_path: Path) -> None:
    runner = RecordingNft()
    parts = Parts(_part(["10.0.0.1"]))
    keeper = FirewallKeeper(parts, FirewallState(tmp_path), _nft(runner))
    await keeper.once()
    runner.table = "table inet llmgw { ... }"
    parts.part = _part(["10.0.0.1"], enabled=False)
    await keeper.once()
    assert runner.applied()[-1] == "table inet llmgw\ndelete table inet llmgw\n"


async def test_the_parts_of_two_processes_share_one_table(tmp_path: Path) -> None:
    runner = RecordingNft()
    state = FirewallState(tmp_path)
    other = FirewallPart.from_json({**_part(["10.0.0.1"]).to_json(), "name": "server-cp1"})
    state.write(other)
    await FirewallKeeper(Parts(_part(["10.0.0.7"])), state, _nft(runner)).once()
    table = runner.applied()[0]
    assert '"agent-n1: engines' in table and '"server-cp1: engines' in table


async def test_a_process_with_nothing_to_guard_never_calls_nft(tmp_path: Path) -> None:
    runner = RecordingNft()
    loopback = agent_part("n1", enabled=True, address="127.0.0.1", ports=(21000, 21999), control_planes=[])
    keeper = FirewallKeeper(Parts(loopback), FirewallState(tmp_path), _nft(runner))
    await keeper.once()
    assert runner.calls == []
    assert not (tmp_path / "agent-n1.json").exists()


async def test_without_nft_one_warning_and_the_part_is_kept_for_a_later_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = RecordingNft()
    parts = Parts(_part(["10.0.0.1"]))
    keeper = FirewallKeeper(parts, FirewallState(tmp_path), _nft(runner, installed=False))
    with caplog.at_level(logging.WARNING):
        await keeper.once()
        parts.part = _part(["10.0.0.1", "10.0.0.5"])
        await keeper.once()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "nft is not installed" in warnings[0]
    assert runner.calls == []
    assert "10.0.0.5" in (tmp_path / "agent-n1.json").read_text()


async def test_a_refusal_by_nft_is_logged_once_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = RecordingNft(returncode=1, stderr="Operation not permitted")
    keeper = FirewallKeeper(Parts(_part(["10.0.0.1"])), FirewallState(tmp_path), _nft(runner))
    with caplog.at_level(logging.WARNING):
        await keeper.once()
        await keeper.once()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Operation not permitted" in warnings[0]
    assert len(runner.applied()) == 2  # not marked applied: tried again


def test_sync_says_what_nft_refused_and_what_to_do(tmp_path: Path) -> None:
    state = FirewallState(tmp_path)
    state.write(_part(["10.0.0.1"]))
    with pytest.raises(FirewallError) as raised:
        sync(state, _nft(RecordingNft(returncode=1, stderr="Error: syntax error")))
    assert "syntax error" in raised.value.message and "root" in raised.value.hint


def test_sync_without_nft_names_the_package(tmp_path: Path) -> None:
    state = FirewallState(tmp_path)
    state.write(_part(["10.0.0.1"]))
    with pytest.raises(FirewallError) as raised:
        sync(state, _nft(RecordingNft(), installed=False))
    assert "apt-get install nftables" in raised.value.hint


def test_a_broken_part_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "agent-n1.json").write_text("{not json")
    with pytest.raises(FirewallError) as raised:
        FirewallState(tmp_path).parts()
    assert "agent-n1.json" in raised.value.message


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("10.0.0.1:8443", "10.0.0.1"),
        ("http://cp1.example:8080", "cp1.example"),
        ("[fd00::1]:8443", "fd00::1"),
        ("fd00::1", "fd00::1"),
        ("node7", "node7"),
    ],
)
def test_the_host_of_an_address(address: str, host: str) -> None:
    assert host_of(address) == host


async def test_the_agents_part_follows_the_control_planes_it_knows() -> None:
    known = ["cp1:8443"]

    async def resolver(host: str) -> list[str]:
        return {"cp1": ["10.0.0.1"], "cp2": ["10.0.0.2", "fd00::2"]}.get(host, [])

    source = agent_source("n1", True, "10.0.0.9", (21000, 21999), lambda: known, resolver)
    assert (await source()).rules[0].sources == ("10.0.0.1",)
    known.append("cp2:8443")  # learned from the leader
    assert (await source()).rules[0].sources == ("10.0.0.1", "10.0.0.2", "fd00::2")


async def test_addresses_of_hosts_that_do_not_resolve_are_left_out() -> None:
    async def resolver(host: str) -> list[str]:
        return ["10.0.0.1"] if host == "10.0.0.1" else []

    assert await addresses(["10.0.0.1:8443", "gone.example:8443", ""], resolver) == ["10.0.0.1"]
