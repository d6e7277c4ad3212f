"""The Ray stand-in is held to the recordings of the real Ray (tests/engines/data/ray-2.60.0-*.txt).

The recordings come from ``make record-ray`` (:mod:`llmgw.testing.ray_recording`),
each naming its source in its first lines: the options llmgw's launcher passes
must be the real ``ray start``'s, the stand-in must take them and refuse what
Ray refuses the way Ray does, and its worker must outlive its head as Ray's
does (so that the launcher's own watch, not the stand-in, is what ends a
worker shard in the fast tests too).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.engines import ray_launcher
from llmgw.testing import ray_standin
from llmgw.testing.eventually import eventually_sync
from llmgw.testing.standin_rendezvous import cluster_gpus

DATA = Path(__file__).parent / "data"
VERSION = ray_standin.IMITATES
HEAD = ray_launcher.head_command("/v/bin/ray", "10.0.0.1:24100", cards=1)
WORKER = ray_launcher.worker_command("/v/bin/ray", "10.0.0.1:24100", "10.0.0.2", cards=1)


def recording(what: str) -> tuple[dict[str, str], list[str]]:
    """A recording's ``# key: value`` header and the lines it recorded."""
    lines = (DATA / f"ray-{VERSION}-{what}.txt").read_text().splitlines()
    header = {}
    for line in lines:
        if line.startswith("# ") and ": " in line:
            key, _, value = line[2:].partition(": ")
            header[key] = value
    assert header["source"].startswith(f"ray {VERSION} (PyPI ray)"), header
    return header, [line for line in lines if not line.startswith("# ")]


def exit_of(header: dict[str, str]) -> tuple[int, float | None]:
    found = re.fullmatch(r"code (\d+)(?: after ([\d.]+) s)?", header["exit"])
    assert found, header["exit"]
    return int(found[1]), float(found[2]) if found[2] else None


def real_options() -> dict[str, bool]:
    """``ray start``'s options from its recorded ``--help``: whether each takes a value."""
    _, lines = recording("start-help")
    found = {}
    for line in lines:
        match = re.match(r"^  (--[a-z-]+)(?: ([A-Z]+|\[[^\]]+\]))?(?:\s|$)", line)
        if match:
            found[match[1]] = match[2] is not None
    assert "--block" in found and "--address" in found, "the recording lists no options"
    return found


def given(argv: list[str]) -> dict[str, str | None]:
    """The options of a ``ray start`` command line, each with its value (None for a flag)."""
    options: dict[str, str | None] = {}
    words = argv[2:]
    for index, word in enumerate(words):
        if word.startswith("--"):
            value = (
                words[index + 1] if index + 1 < len(words) and not words[index + 1].startswith("--") else None
            )
            options[word] = value
    return options


@pytest.mark.parametrize("argv", [HEAD, WORKER], ids=["head", "worker"])
def test_every_option_the_launcher_passes_is_one_the_real_ray_start_has_in_the_same_form(
    argv: list[str],
) -> None:
    real = real_options()
    for option, value in given(argv).items():
        assert option in real, f"ray {VERSION}'s ray start has no {option}"
        assert real[option] == (value is not None), f"{option}: takes a value in Ray: {real[option]}"


@pytest.mark.parametrize("argv", [HEAD, WORKER], ids=["head", "worker"])
def test_the_stand_in_takes_the_command_lines_the_launcher_gives(argv: list[str]) -> None:
    options = ray_standin.parser().parse_args(argv[2:])
    assert options.block and options.num_gpus == 1 and options.disable_usage_stats
    assert options.node_ip_address == ("10.0.0.1" if options.head else "10.0.0.2")


def test_the_stand_in_refuses_an_option_ray_lacks_as_ray_does(capsys: pytest.CaptureFixture[str]) -> None:
    header, lines = recording("start-unknown-option")
    with pytest.raises(SystemExit) as ended:
        ray_standin.main(["start", "--head", "--no-such-option", "--block"])
    assert ended.value.code == exit_of(header)[0] == 2
    said = capsys.readouterr().err
    assert [line for line in lines if line.startswith("Error:")] == [
        line for line in said.splitlines() if line.startswith("Error:")
    ]


def test_the_stand_in_refuses_a_head_only_option_on_a_worker_as_ray_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    header, lines = recording("worker-head-only-option")
    argv = [*WORKER[1:-1], "--include-dashboard", "false", "--block"]
    assert ray_standin.main(argv) == exit_of(header)[0] == 1
    message = "`--include-dashboard` should only be specified when starting head node with `--head`."
    assert any(message in line for line in lines)
    assert message in capsys.readouterr().err


def test_the_stand_ins_reconnect_timeout_is_the_one_ray_was_seen_to_wait() -> None:
    header, lines = recording("worker-head-lost")
    code, taken = exit_of(header)
    assert code == 1 and taken is not None
    assert ray_standin.GCS_RECONNECT_TIMEOUT_S <= taken <= ray_standin.GCS_RECONNECT_TIMEOUT_S + 30
    assert any("raylet [exit code=1]" in line for line in lines)


def test_a_head_whose_link_was_cut_keeps_rays_worker_waiting_longer_still() -> None:
    header, _ = recording("worker-head-link-cut")
    code, taken = exit_of(header)
    assert code == 1 and taken is not None and taken > ray_standin.GCS_RECONNECT_TIMEOUT_S
    assert taken > ray_launcher.HEAD_LOST_S * 4  # why the launcher watches its head itself


def test_the_gpus_a_real_cluster_holds_are_read_from_its_recorded_ray_status() -> None:
    _, lines = recording("status")
    text = "\n".join(lines)
    assert cluster_gpus(text) == 2.0
    assert cluster_gpus(text.replace("0.0/2.0 GPU", "0.0/1.0 GPU")) == 1.0
    assert cluster_gpus(re.sub(r".*GPU\n", "", text)) == 0.0  # a cluster of CPUs only
    assert cluster_gpus("Error: could not connect to the GCS") is None


def test_the_stand_ins_worker_outlives_its_head_for_the_reconnect_timeout_then_exits_as_ray_does(
    tmp_path: Path,
) -> None:
    code, _ = exit_of(recording("worker-head-lost")[0])
    port = _free_port()
    env = {**os.environ, "RAY_gcs_rpc_server_reconnect_timeout_s": "2", "CUDA_VISIBLE_DEVICES": "0"}
    ray = [sys.executable, "-m", "llmgw.testing.ray_standin", "start"]
    head = subprocess.Popen([*ray, "--head", "--port", str(port), "--block"], env=env)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [*ray, "--address", f"127.0.0.1:{port}", "--block"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        eventually_sync(
            lambda: "joined the head" in log.read_text(), timeout_s=30, message="the worker joined"
        )
        head.kill()
        head.wait()
        eventually_sync(lambda: "lost the head" in log.read_text(), timeout_s=30, message="the worker saw it")
        lost_at = time.monotonic()
        assert worker.poll() is None  # still waiting for the cluster, as Ray's raylet does
        assert worker.wait(30) == code
        assert time.monotonic() - lost_at >= 1.5
        assert "raylet [exit code=1]" in log.read_text()
    finally:
        for process in (head, worker):
            if process.poll() is None:
                process.kill()
            process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
