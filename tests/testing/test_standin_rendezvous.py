"""Multi-node stand-ins rendezvous over TCP: the head serves once every rank is in, a lost peer ends them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.engines import ray_launcher
from llmgw.testing.eventually import eventually_sync
from llmgw.testing.standin_programs import StandinPrograms, write_standins


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


@pytest.fixture
def programs(tmp_path: Path) -> StandinPrograms:
    return write_standins(tmp_path / "bin")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


def start(
    processes: list[subprocess.Popen[bytes]],
    argv: list[str],
    cards: str = "",
    output: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": cards, "LLMGW_STANDIN_STARTUP_S": "0", **(env or {})}
    with open(output or os.devnull, "wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def sglang(programs: StandinPrograms, port: int, rank: int, rendezvous: str) -> list[str]:
    return [
        str(programs.python), "-m", "sglang.launch_server", "--model-path", "m", "--port", str(port),
        "--tp-size", "2", "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", rendezvous,
    ]  # fmt: skip


def test_sglang_rank_0_serves_once_rank_1_joins_and_rank_1_exits_when_rank_0_goes(
    programs: StandinPrograms, started: list[subprocess.Popen[bytes]]
) -> None:
    head_port, member_port, rendezvous = free_port(), free_port(), f"127.0.0.1:{free_port()}"
    head = start(started, sglang(programs, head_port, 0, rendezvous))
    eventually_sync(lambda: _listening(rendezvous), timeout_s=30, message="rank 0 listens for its peers")
    assert health(head_port) == 0  # waits for rank 1: not serving yet
    member = start(started, sglang(programs, member_port, 1, rendezvous))
    eventually_sync(lambda: health(head_port) == 200, timeout_s=30, message="rank 0 serves")
    eventually_sync(lambda: health(member_port) == 200, timeout_s=30, message="rank 1 answers /health")
    head.kill()
    assert member.wait(30) == 1


def test_vllm_over_ray_serves_once_the_cluster_holds_tp_x_pp_cards_and_ends_when_a_node_goes(
    programs: StandinPrograms, started: list[subprocess.Popen[bytes]]
) -> None:
    launcher = [sys.executable, "-m", "llmgw.engines.ray_launcher", "--ray", str(programs.ray)]
    serve_port, worker_port, rendezvous = free_port(), free_port(), f"127.0.0.1:{free_port()}"
    vllm = [str(programs.vllm), "serve", "m", "--port", str(serve_port), "--host", "127.0.0.1",
            "--tensor-parallel-size", "1", "--pipeline-parallel-size", "2",
            "--distributed-executor-backend", "ray"]  # fmt: skip
    head = start(started, [*launcher, "--head", "--address", rendezvous, "--", *vllm], cards="0")
    eventually_sync(lambda: _listening(rendezvous), timeout_s=30, message="the Ray head listens")
    assert health(serve_port) == 0  # one card of the two it needs
    worker = start(started, [*launcher, "--address", rendezvous, "--port", str(worker_port)], cards="0")
    eventually_sync(lambda: health(serve_port) == 200, timeout_s=30, message="vLLM serves on the head")
    eventually_sync(lambda: health(worker_port) == 200, timeout_s=30, message="the worker answers /health")
    worker.kill()  # the shard killed outright: its Ray node goes with it and leaves the cluster
    worker.wait(30)
    assert head.wait(30) == 1  # vLLM lost a card of its placement group: the head ends, and with it Ray


def test_a_ray_worker_shard_exits_soon_after_its_head_goes_though_rays_own_worker_waits_on(
    programs: StandinPrograms, started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    rendezvous = f"127.0.0.1:{free_port()}"
    head = start(
        started, [str(programs.ray), "start", "--head", "--port", rendezvous.split(":")[1], "--block"]
    )
    eventually_sync(lambda: _listening(rendezvous), timeout_s=30, message="the Ray head listens")
    output = tmp_path / "worker.log"
    launcher = [sys.executable, "-m", "llmgw.engines.ray_launcher", "--ray", str(programs.ray)]
    worker_port = free_port()
    worker = start(
        started,
        [*launcher, "--address", rendezvous, "--port", str(worker_port), "--head-lost-s", "2"],
        "0",
        output,
        env={"RAY_gcs_rpc_server_reconnect_timeout_s": "120"},  # Ray's own worker waits on, as Ray's does
    )
    eventually_sync(lambda: health(worker_port) == 200, timeout_s=30, message="the worker shard is in")
    ray_node = ray_launcher.descendants(worker.pid)
    head.kill()
    lost_at = time.monotonic()
    assert worker.wait(30) == ray_launcher.HEAD_LOST_EXIT
    taken = time.monotonic() - lost_at
    assert 2 - ray_launcher.PROBE_S <= taken < 2 + ray_launcher.PROBE_S + ray_launcher.PROBE_TIMEOUT_S + 3, (
        taken
    )
    assert "took no connection for 2 s" in output.read_text()
    assert ray_node and not [pid for pid in ray_node if _running(pid)]  # its Ray node went with it


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False
