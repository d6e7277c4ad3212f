"""engine_pid finds the process that serves a port, not another that merely names it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from llmgw.testing.cluster import engine_pid, free_port
from llmgw.testing.eventually import eventually_sync

LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(sys.argv[2])))\n"
    "s.listen()\n"
    "time.sleep(60)\n"
)
NAME_ONLY = "import time; time.sleep(60)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def test_the_process_holding_the_port_is_found_though_another_names_it_first(
    started: list[subprocess.Popen[bytes]],
) -> None:
    port = free_port()
    decoy = subprocess.Popen([sys.executable, "-c", NAME_ONLY, "--port", str(port)], start_new_session=True)
    started.append(decoy)
    server = subprocess.Popen([sys.executable, "-c", LISTEN, "--port", str(port)], start_new_session=True)
    started.append(server)
    program = sys.executable.rsplit("/", 1)[1].encode()

    def found() -> int | None:
        pid = engine_pid(port, program)
        return pid if pid == server.pid else None

    message = "the listening process is found, not the one naming its port first"
    assert eventually_sync(found, timeout_s=10, message=message) == server.pid


def test_no_process_on_the_port_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="no python"):
        engine_pid(free_port(), b"python")
