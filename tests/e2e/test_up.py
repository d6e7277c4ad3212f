"""`llmgw up` as a newcomer runs it: the printed URL and key answer through the openai SDK."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import free_port

pytestmark = pytest.mark.e2e


def run_up(
    home: Path, port: int, agent_port: int, cache: Path
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw.cli.main",
            "up",
            "--home",
            str(home),
            "--port",
            str(port),
            "--agent-port",
            str(agent_port),
            "--timeout",
            "300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "LLMGW_CACHE": str(cache), "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # its own process group, as under make or a supervisor
    )
    printed: dict[str, str] = {}
    output = []
    assert process.stdout is not None
    for line in process.stdout:
        output.append(line)
        if match := re.match(r"^export (OPENAI_BASE_URL|OPENAI_API_KEY)=(\S+)$", line.strip()):
            printed[match[1]] = match[2]
        if len(printed) == 2:
            return process, printed
    raise AssertionError("llmgw up ended without printing the endpoint:\n" + "".join(output))


def stop(process: subprocess.Popen[str]) -> int:
    """SIGINT to ``up`` alone, as a terminal's Ctrl-C in the foreground."""
    process.send_signal(signal.SIGINT)
    return process.wait(60)


def stop_group(process: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGINT to ``up``'s whole process group at once, as a supervisor sends it: its exit code and output."""
    os.killpg(process.pid, signal.SIGINT)
    code = process.wait(60)
    assert process.stdout is not None
    return code, process.stdout.read()


def ask(printed: dict[str, str]) -> str:
    client = openai.OpenAI(
        base_url=printed["OPENAI_BASE_URL"], api_key=printed["OPENAI_API_KEY"], max_retries=0
    )
    answer = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=8
    )
    return answer.choices[0].message.content or ""


def test_up_serves_then_stops_and_starts_again_from_the_same_state(
    tmp_path: Path, engine_cache: Path, model_file: Path
) -> None:
    home = tmp_path / "home"
    port, agent_port = free_port(), free_port()
    process, printed = run_up(home, port, agent_port, engine_cache)
    try:
        assert printed["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1"
        assert ask(printed)
    finally:
        code, said = stop_group(process)
    assert (code, "exited with code" in said) == (0, False), said
    with pytest.raises(openai.APIConnectionError):
        ask(printed)
    again, printed_again = run_up(home, port, agent_port, engine_cache)
    try:
        assert printed_again == printed
        assert ask(printed_again)
    finally:
        stop(again)
