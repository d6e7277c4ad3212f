"""run_as (C2.5): an agent running as root starts its engine as llmgw-engine, in that user's home.

The test creates the user (``useradd --system``) when the machine lacks it,
and removes it again afterwards. The cluster lives in a directory that user
can read, with a copy of the llama.cpp build: weights and engine files must be
readable by the engines' user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmgw.cli.up import DEFAULT_MODEL
from llmgw.testing.cluster import Cluster, engine_pid

pytestmark = pytest.mark.e2e

USER = "llmgw-engine"


@pytest.fixture(scope="module")
def engine_user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("engines change user only when the agent runs as root")
    created = False
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True
        )
        created = True
        entry = pwd.getpwnam(USER)
    try:
        yield entry
    finally:
        if created:
            subprocess.run(["userdel", USER], check=False)


@pytest.fixture(scope="module")
def root_cluster(engine_user: pwd.struct_passwd, engine_cache: Path, model_file: Path) -> Iterator[Cluster]:
    home = Path(tempfile.mkdtemp(prefix="llmgw-run-as-"))
    home.chmod(0o755)
    shutil.copytree(engine_cache / "engines" / "llama.cpp", home / "cache" / "engines" / "llama.cpp")
    running = Cluster(home / "cluster", home / "cache")
    (home / "cluster").chmod(0o755)
    try:
        running.start_server()
        blob = running.upload(model_file)
        running.admin.request(
            "POST",
            "/api/models",
            {
                "name": DEFAULT_MODEL,
                "source": {"sha256": blob["sha256"], "filename": model_file.name},
                "profile": {"ctx_size": 2048, "parallel": 1},
            },
        )
        running.key = running.admin.request("POST", "/api/keys", {"name": "tests"})["key"]  # type: ignore[attr-defined]
        running.add_node("node1", run_as=USER)
        running.start_agent("node1")
        yield running
    finally:
        running.stop()
        shutil.rmtree(home, ignore_errors=True)


def _status(pid: int, field: str) -> list[str]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split()[1:]
    raise LookupError(field)


def test_an_agent_running_as_root_runs_its_engine_as_the_run_as_user(
    root_cluster: Cluster, engine_user: pwd.struct_passwd
) -> None:
    replica = root_cluster.wait_ready(DEFAULT_MODEL, 120)
    pid = engine_pid(replica["port"])
    assert _status(pid, "Uid") == [str(engine_user.pw_uid)] * 4
    assert _status(pid, "Gid") == [str(engine_user.pw_gid)] * 4
    home = root_cluster.home / "nodes" / "node1" / "work" / "home" / USER
    assert Path(os.readlink(f"/proc/{pid}/cwd")) == home.resolve()
    assert home.stat().st_mode & 0o777 == 0o700 and home.stat().st_uid == engine_user.pw_uid
    environment = dict(
        item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
    )
    assert environment["HOME"] == str(home)
    assert environment["XDG_CACHE_HOME"] == str(home / ".cache")
    client = openai.OpenAI(base_url=f"{root_cluster.url}/v1", api_key=root_cluster.key, max_retries=0)  # type: ignore[attr-defined]
    answer = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    assert answer.choices[0].message.content
    assert f"engines run as {USER}" in root_cluster.log("agent-node1").read_text()
    key_file = Path(argv_of(pid)[argv_of(pid).index("--api-key-file") + 1])
    assert key_file.parent == root_cluster.home / "nodes" / "node1" / "work" / "shards" / replica["id"]
    assert key_file.stat().st_uid == engine_user.pw_uid, "the engine's user owns its key file"
    assert key_file.stat().st_mode & 0o777 == 0o600


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
