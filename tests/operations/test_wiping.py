"""``llmgw wipe`` in a scratch root the test lays out: what goes, what stays, engines stopped (C10.3)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.agent.shardstates import ShardRecord, process_start_time, write_state
from llmgw.cli.main import app
from llmgw.core.shards import ShardSpec
from llmgw.errors import LlmgwError
from llmgw.operations.wiping import (
    KEEPALIVED_MARK,
    Completed,
    EngineProcess,
    Layout,
    Machine,
    plan,
    remove_path,
    stop_engine,
    wipe,
)
from llmgw.provisioning.wipe import layout_of

HOST = "scratchhost"


def _lay_out(root: Path) -> None:
    files = {
        "etc/hostname": HOST + "\n",
        "etc/llmgw/server.yaml": "name: cp1\ndata_dir: /var/lib/llmgw\n",
        "etc/llmgw/agent.yaml": "node_id: n1\ncontrol_planes: [127.0.0.1:8443]\n",
        "etc/llmgw/ca.crt": "CA\n",
        "etc/llmgw/work/weights/models/abc/model.gguf": "weights\n",
        "etc/llmgw/work/shards/r0/output.log": "log\n",
        "var/lib/llmgw/llmgw.db": "db\n",
        "var/lib/llmgw/mirror/blobs/aa": "blob\n",
        "var/lib/llmgw/usage-spill.jsonl": "{}\n",
        "root/.cache/llmgw/engines/llamacpp/llama-server": "build\n",
        "etc/systemd/system/llmgw-agent.service": "[Service]\n",
        "etc/systemd/system/llmgw-server.service": "[Service]\n",
        "usr/local/share/ca-certificates/llmgw-ca.crt": "CA\n",
        "usr/local/share/ca-certificates/other.crt": "someone else's\n",
        "etc/keepalived/keepalived.conf": KEEPALIVED_MARK + "\nvrrp_instance llmgw_7 {}\n",
        "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n"
        "llmgw-engine:x:999:999::/nonexistent:/usr/sbin/nologin\n",
        "etc/group": "root:x:0:\nllmgw-engine:x:999:\n",
        "etc/shadow": "root:*:19000:0:99999:7:::\nllmgw-engine:!:19000::::::\n",
        "etc/gshadow": "root:*::\nllmgw-engine:!::\n",
        "etc/other.conf": "not llmgw's\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "llmgw-agent.service").symlink_to("../llmgw-agent.service")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A running engine with its shard's state file under the scratch root."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    process = subprocess.Popen([sleep, "300"])
    started = process_start_time(process.pid)
    assert started
    write_state(
        tmp_path / "etc/llmgw/work/shards/r1",
        ShardRecord(
            spec=ShardSpec(replica_id="r1"), command=[sleep, "300"], pid=process.pid, start_time=started
        ),
    )
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def _exists(root: Path, *names: str) -> list[bool]:
    return [(root / name).exists() for name in names]


def test_a_dry_run_lists_everything_and_removes_nothing(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    answer = CliRunner().invoke(app, ["wipe", "--root", str(tmp_path), "--dry-run", "--json"])
    assert answer.exit_code == 0, answer.output
    listed = json.loads(answer.output)
    kinds = [item["kind"] for item in listed["items"]]
    assert listed["machine"] == HOST and listed["dry_run"] is True
    assert kinds == [
        "unit", "unit", "configuration", "state", "builds", "ca", "keepalived", "user",
    ]  # fmt: skip
    assert all(_exists(tmp_path, "etc/llmgw/server.yaml", "var/lib/llmgw/llmgw.db", "etc/passwd"))


def test_wipe_removes_llmgw_and_keeps_the_weights_the_store_and_what_is_not_llmgws(
    tmp_path: Path, engine: subprocess.Popen[bytes]
) -> None:
    _lay_out(tmp_path)
    answer = CliRunner().invoke(app, ["wipe", "--root", str(tmp_path), "--yes-i-mean", HOST])
    assert answer.exit_code == 0, answer.output
    assert engine.wait(timeout=10) == -signal.SIGTERM  # stopped by the pid its state file gave
    gone = [
        "etc/systemd/system/llmgw-agent.service",
        "etc/systemd/system/llmgw-server.service",
        "etc/systemd/system/multi-user.target.wants/llmgw-agent.service",
        "etc/llmgw/server.yaml",
        "etc/llmgw/ca.crt",
        "etc/llmgw/work/shards",
        "var/lib/llmgw/usage-spill.jsonl",
        "root/.cache/llmgw",
        "usr/local/share/ca-certificates/llmgw-ca.crt",
        "etc/keepalived/keepalived.conf",
    ]
    assert [name for name in gone if (tmp_path / name).exists()] == []
    kept = [
        "etc/llmgw/work/weights/models/abc/model.gguf",
        "var/lib/llmgw/mirror/blobs/aa",
        "var/lib/llmgw/llmgw.db",
        "usr/local/share/ca-certificates/other.crt",
        "etc/other.conf",
    ]
    assert [name for name in kept if not (tmp_path / name).exists()] == []
    assert "llmgw-engine" not in (tmp_path / "etc/passwd").read_text()
    assert "root:x:0:0" in (tmp_path / "etc/passwd").read_text()


def test_models_and_store_go_when_asked(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    answer = CliRunner().invoke(app, ["wipe", "--root", str(tmp_path), "--all", "--yes-i-mean", HOST])
    assert answer.exit_code == 0, answer.output
    assert not any(_exists(tmp_path, "etc/llmgw", "var/lib/llmgw", "root/.cache/llmgw"))


def test_a_wrong_name_removes_nothing(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    answer = CliRunner().invoke(app, ["wipe", "--root", str(tmp_path), "--yes-i-mean", "otherhost"])
    assert isinstance(answer.exception, LlmgwError)
    assert "not this machine's name" in answer.exception.message
    assert all(_exists(tmp_path, "etc/llmgw/server.yaml", "etc/systemd/system/llmgw-agent.service"))


def test_the_name_typed_at_the_question_is_checked(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    answer = CliRunner().invoke(app, ["wipe", "--root", str(tmp_path)], input="nothost\n")
    assert isinstance(answer.exception, LlmgwError)
    assert (tmp_path / "etc/llmgw/server.yaml").exists()
    answer = CliRunner().invoke(app, ["wipe", "--root", str(tmp_path)], input=HOST + "\n")
    assert answer.exit_code == 0, answer.output
    assert not (tmp_path / "etc/llmgw/server.yaml").exists()


def test_keepalived_configuration_not_written_by_llmgw_stays(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    (tmp_path / "etc/keepalived/keepalived.conf").write_text("vrrp_instance mine {}\n")
    kinds = [i.kind for i in plan(layout_of(tmp_path), [], models=False, store=False, nft_table=False)]
    assert "keepalived" not in kinds


def test_the_layout_follows_the_configuration_files(tmp_path: Path) -> None:
    (tmp_path / "etc/llmgw").mkdir(parents=True)
    (tmp_path / "etc/llmgw/server.yaml").write_text("data_dir: data\n")
    (tmp_path / "etc/llmgw/agent.yaml").write_text("work_dir: /srv/llmgw/work\ncache_dir: ~/builds\n")
    layout = layout_of(tmp_path)
    assert layout.data_dir == tmp_path / "etc/llmgw/data"
    assert layout.work_dir == tmp_path / "srv/llmgw/work"
    assert layout.cache_dirs[0] == tmp_path / "root/builds"


class RecordingMachine:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.signals: list[tuple[int, int]] = []

    def run(self, argv: Sequence[str]) -> Completed:
        self.calls.append(list(argv))
        return Completed(0, "", "")

    def machine(self) -> Machine:
        return Machine(self.run, kill=lambda pid, sig: self.signals.append((pid, sig)))


def test_on_the_machine_itself_units_stop_the_table_goes_and_the_trust_store_is_refreshed(
    tmp_path: Path,
) -> None:
    _lay_out(tmp_path)
    layout = _live(tmp_path)
    items = plan(layout, [], models=False, store=False, nft_table=True)
    recording = RecordingMachine()
    outcomes = wipe(items, layout, [], recording.machine())
    assert all(o.ok for o in outcomes), [o.result for o in outcomes]
    assert recording.calls[0] == ["systemctl", "disable", "--now", "llmgw-server.service"]
    assert ["nft", "delete", "table", "inet", "llmgw"] in recording.calls
    assert ["update-ca-certificates", "--fresh"] in recording.calls
    assert recording.calls[-1] == ["userdel", "llmgw-engine"]
    units = [i for i, c in enumerate(recording.calls) if c[:2] == ["systemctl", "disable"]]
    assert max(units) < recording.calls.index(["nft", "delete", "table", "inet", "llmgw"])


def _failing_systemctl(said: str) -> Machine:
    def run(argv: Sequence[str]) -> Completed:
        return Completed(1, "", said) if argv[0] == "systemctl" else Completed(0, "", "")

    return Machine(run)


def _live(root: Path) -> Layout:
    return Layout(root, root / "etc/llmgw", root / "var/lib/llmgw", root / "etc/llmgw/work", live=True)


def test_a_failed_step_is_reported_and_the_rest_still_goes(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    layout = _live(tmp_path)
    machine = _failing_systemctl("Unit llmgw-agent.service is masked.")
    outcomes = wipe(plan(layout, [], models=False, store=False, nft_table=False), layout, [], machine)
    failed = [o for o in outcomes if not o.ok]
    assert {o.item.kind for o in failed} == {"unit"} and "masked" in failed[0].result
    assert not (tmp_path / "etc/llmgw/server.yaml").exists()


def test_units_on_a_machine_without_systemd_running_have_nothing_to_stop(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    layout = _live(tmp_path)
    machine = _failing_systemctl("System has not been booted with systemd as init system (PID 1).")
    outcomes = wipe(plan(layout, [], models=False, store=False, nft_table=False), layout, [], machine)
    units = [o for o in outcomes if o.item.kind == "unit"]
    assert units and all(o.ok and "systemd is not running" in o.result for o in units)
    assert not (tmp_path / "etc/systemd/system/llmgw-agent.service").exists()


def test_an_engine_that_ignores_sigterm_gets_sigkill_after_the_grace() -> None:
    recording = RecordingMachine()
    now = [0.0]

    def pause(seconds: float) -> None:
        now[0] += seconds

    machine = Machine(
        recording.run,
        kill=lambda pid, sig: recording.signals.append((pid, sig)),
        monotonic=lambda: now[0],
        pause=pause,
    )
    stubborn = EngineProcess(4242, "r1", still_it=lambda: True)
    assert stop_engine(stubborn, machine, grace_s=1.0) == "killed after the grace"
    assert recording.signals == [(4242, signal.SIGTERM), (4242, signal.SIGKILL)]


def test_a_pid_that_is_no_longer_the_engine_is_never_signalled() -> None:
    recording = RecordingMachine()
    reused = EngineProcess(4242, "r1", still_it=lambda: False)
    assert stop_engine(reused, recording.machine()) == "already gone"
    assert recording.signals == []


def test_removing_a_tree_keeps_the_paths_asked_for(tmp_path: Path) -> None:
    (tmp_path / "a/b/keep").mkdir(parents=True)
    (tmp_path / "a/b/keep/f").write_text("x")
    (tmp_path / "a/b/gone").write_text("x")
    (tmp_path / "a/c").mkdir()
    remove_path(tmp_path / "a", [tmp_path / "a/b/keep"])
    assert (tmp_path / "a/b/keep/f").exists()
    assert not (tmp_path / "a/b/gone").exists() and not (tmp_path / "a/c").exists()
