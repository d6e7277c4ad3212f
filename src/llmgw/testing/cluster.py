"""A real cluster on this machine for end-to-end tests: control plane and agent processes.

Each process is the same ``llmgw server run`` / ``llmgw agent run`` that
production runs, started as a subprocess with its own state directory.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from llmgw.agent.config import AgentConfig, save_agent_config
from llmgw.agent.launching import kill_group
from llmgw.agent.shardstates import is_engine, read_state
from llmgw.client.admin import AdminClient
from llmgw.controlplane.config import ServerConfig, save_server_config
from llmgw.errors import LlmgwError
from llmgw.provisioning.clusters import add_control_plane, initialise, issue_node_certificate
from llmgw.testing.eventually import eventually_sync

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """:func:`~llmgw.testing.eventually.eventually_sync` as end-to-end tests call it.

    A process not answering yet (``OSError``) or answering with an error
    (:class:`LlmgwError`) means "not yet"; :class:`AssertionError` names
    ``what`` after ``timeout_s``.
    """
    return eventually_sync(
        condition, timeout_s=timeout_s, interval_s=interval_s, message=what, ignoring=(LlmgwError, OSError)
    )


def engine_pid(port: int, program: bytes = b"llama-server") -> int:
    """The engine process (``program``) listening on ``port``.

    Found by its command line, and of those by the listening socket it holds: a process left from
    another run may name the same port, and processes an engine forked (vLLM's engine core) may
    hold its socket too, so of the holders the one leading its process group is taken (an engine
    leads one of its own), whatever the order of their ids."""
    named: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(program) and str(port).encode() in argv:
            named.append(int(entry))
    holding = [pid for pid in named if _listens(pid, port)]
    for pid in holding:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                return pid
    if holding or named:
        return min(holding or named)
    raise LookupError(f"no {program.decode()} on port {port}")


def _listens(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a socket listening on TCP ``port`` (in its own network namespace)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{descriptor}") in inodes:
                return True
    return False


@dataclass
class Cluster:
    """Control planes (``cp1`` in ``home``, others in ``home/<name>``) and agents, as processes.

    ``store_url`` (PostgreSQL) lets :meth:`add_control_plane` add standbys;
    ``lease_s`` shortens the leader lease for tests. ``http_host`` and
    ``agent_host`` are where cp1 listens (127.0.0.1; an address inside a network
    namespace the test made, with ``wrap`` given to :meth:`start_server` and
    :meth:`start_agent` running each process there: :mod:`llmgw.testing.netns`).

    A context manager: ``with Cluster(home, cache) as cluster:`` stops every
    process it started, and the engines its agents left, when the block ends,
    by a failure too (:meth:`stop`).
    """

    home: Path
    cache_dir: Path
    http_port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    store_url: str = ""
    lease_s: float | None = None
    key: str = ""
    """An API key for /v1, once :meth:`create_key` made one."""
    http_host: str = "127.0.0.1"
    agent_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.config = initialise(
            self.home,
            name="cp1",
            http_host=self.http_host,
            http_port=self.http_port,
            agent_host=self.agent_host,
            agent_port=self.agent_port,
            store_url=self.store_url,
        )
        if self.lease_s is not None:
            self.config.leadership.lease_s = self.lease_s
            save_server_config(self.config, self.home / "server.yaml")
        self.token = (self.home / "admin.token").read_text().strip()
        self.admin = AdminClient(self.url, self.token)
        self.planes: dict[str, ServerConfig] = {"cp1": self.config}

    @property
    def url(self) -> str:
        return f"http://{self.http_host}:{self.http_port}"

    def url_of(self, name: str) -> str:
        return f"http://{self.planes[name].http.host}:{self.planes[name].http.port}"

    def admin_of(self, name: str) -> AdminClient:
        return AdminClient(self.url_of(name), self.token)

    def config_path(self, name: str) -> Path:
        return self.home / "server.yaml" if name == "cp1" else self.home / name / "server.yaml"

    def add_control_plane(self, name: str) -> ServerConfig:
        """A standby (same CA, token and store) with ports of its own; start it with :meth:`start_server`."""
        self.planes[name] = add_control_plane(
            self.config,
            self.home / name,
            name=name,
            http_host="127.0.0.1",
            http_port=free_port(),
            agent_host="127.0.0.1",
            agent_port=free_port(),
        )
        return self.planes[name]

    def leader(self) -> str:
        """The name of the control plane whose /leader answers 200, or ""."""
        for name in self.planes:
            if self.processes.get(self.process_name(name)) is None:
                continue
            with contextlib.suppress(OSError, LlmgwError, ValueError):
                with urllib.request.urlopen(f"{self.url_of(name)}/leader", timeout=2) as answer:
                    if answer.status == 200:
                        return name
        return ""

    @staticmethod
    def process_name(name: str) -> str:
        return "server" if name == "cp1" else f"server-{name}"

    def add_node(self, node_id: str, **settings: Any) -> Path:
        """Write a node's agent.yaml; its engines run as the agent unless ``run_as`` is given.

        Each node serves its metrics on a port of its own (``metrics``), found free now."""
        settings.setdefault("run_as", "")
        settings.setdefault("metrics", {"port": free_port()})
        directory = self.home / "nodes" / node_id
        issue_node_certificate(self.config, node_id, directory)
        config = AgentConfig(
            node_id=node_id,
            control_planes=[f"{self.agent_host}:{self.agent_port}"],
            cache_dir=str(self.cache_dir),
            **settings,
        )
        save_agent_config(config, directory / "agent.yaml")
        return directory / "agent.yaml"

    def add_model(
        self, name: str, weights: Path, profile: dict[str, Any] | None = None, via: AdminClient | None = None
    ) -> str:
        """Import ``weights`` into the mirror and add a model serving them; the weights' sha256."""
        admin = via or self.admin
        blob = self.upload(weights)
        definition: dict[str, Any] = {
            "name": name,
            "source": {"sha256": blob["sha256"], "filename": weights.name},
        }
        if profile:
            definition["profile"] = profile
        admin.request("POST", "/api/models", definition)
        return str(blob["sha256"])

    def start_leader_and_standby(self, lead_s: float = 30) -> None:
        """cp1 started and leading, then cp2 started beside it, standing by (``store_url`` needed)."""
        self.add_control_plane("cp2")
        self.start_server("cp1")
        wait_for(lambda: self.leader() == "cp1", lead_s, "cp1 leads")
        self.start_server("cp2")

    def add_standin_model(self, name: str) -> str:
        """Add a model whose weights are a few bytes (the stand-in engines never read them); their sha256."""
        weights = self.home / f"{name}.standin.gguf"
        weights.write_bytes(b"GGUF stand-in\n")
        return self.add_model(name, weights)

    def upload(self, file: Path | None = None, *, filename: str = "", data: bytes = b"") -> dict[str, Any]:
        """Import ``file`` (or ``data`` under ``filename``) into the mirror; the blob's sha256 and size."""
        if file is not None:
            with file.open("rb") as body:
                return self.admin.request(  # type: ignore[no-any-return]
                    "POST", f"/api/mirror/blobs?filename={file.name}", data=body, length=file.stat().st_size
                )
        return self.admin.request(  # type: ignore[no-any-return]
            "POST", f"/api/mirror/blobs?filename={filename}", data=io.BytesIO(data), length=len(data)
        )

    def metrics(self, name: str = "cp1") -> str:
        """Control plane ``name``'s ``/metrics`` text, read with the admin token (it wants one)."""
        return self.admin_of(name).text("/metrics")[0]

    def create_key(self, name: str = "tests", via: AdminClient | None = None) -> str:
        """A new API key for /v1, kept as :attr:`key`."""
        self.key = str((via or self.admin).request("POST", "/api/keys", {"name": name})["key"])
        return self.key

    def log(self, name: str) -> Path:
        return self.home / "logs" / f"{name}.log"

    def start(
        self, name: str, *args: str, module: str = "llmgw.cli.main", wrap: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        """``python -m module *args`` as process ``name`` (``llmgw`` itself unless told otherwise), run
        by ``wrap`` where given (``ip netns exec NS``: it execs the command, so the pid is the same)."""
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        with self.log(name).open("ab") as out:
            process = subprocess.Popen(
                [*wrap, sys.executable, "-m", module, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.processes[name] = process
        return process

    def start_server(self, name: str = "cp1", wait: bool = True, wrap: Sequence[str] = ()) -> None:
        self.start(
            self.process_name(name), "server", "run", "--config", str(self.config_path(name)), wrap=wrap
        )
        if wait:
            wait_for(lambda: self.admin_of(name).get("/api/status"), 30, f"control plane {name} answers")

    def start_agent(self, node_id: str = "node1", wrap: Sequence[str] = ()) -> None:
        path = self.home / "nodes" / node_id / "agent.yaml"
        if not path.exists():
            self.add_node(node_id)
        self.start(f"agent-{node_id}", "agent", "run", "--config", str(path), wrap=wrap)

    def kill(self, name: str, signum: int = signal.SIGKILL) -> None:
        process = self.processes.pop(name)
        process.send_signal(signum)
        process.wait(30)

    def replicas(self, model: str) -> list[dict[str, Any]]:
        return [r for r in self.admin.get("/api/replicas") if r["model"] == model]

    def wait_ready(self, model: str, timeout_s: float = 120) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            return next((r for r in self.replicas(model) if r["state"] == "ready"), None)

        try:
            found = wait_for(ready, timeout_s, f"a replica of {model} is ready")
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- logs ---\n{self.tails()}") from None
        assert found is not None
        return found

    def tails(self, lines: int = 25) -> str:
        out = []
        for name in sorted(self.processes):
            text = self.log(name).read_text(errors="replace").splitlines()[-lines:]
            out.append(f"[{name}]\n" + "\n".join(text))
        return "\n".join(out)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every process started (SIGTERM, SIGKILL after 20 s), then the engines they left.

        An interrupt while waiting ends the waits, not the stopping: whatever still runs is killed
        and the engines are stopped before it goes on.
        """
        processes = list(self.processes.values())
        self.processes.clear()
        try:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(20)
        finally:
            for process in processes:
                if process.poll() is None:  # past its grace, or an interrupt came first
                    process.kill()
                    process.wait()
            self.stop_orphaned_engines()

    def engine_key(self, port: int) -> str:
        """The key of the replica whose engine serves ``port``, from its shard's state file on its node
        (engines take it from a key file or their environment, never their command line)."""
        for directory in self.home.glob("nodes/*/work/shards/*"):
            with contextlib.suppress(LlmgwError):
                record = read_state(directory)
                if record.port == port:
                    return record.spec.api_key
        raise LookupError(f"no shard of this cluster serves port {port}")

    def stop_orphaned_engines(self) -> None:
        """Stop engines left by an agent that was killed and not started again (they outlive it), each
        with the processes it started."""
        for directory in self.home.glob("nodes/*/work/shards/*"):
            with contextlib.suppress(LlmgwError):
                record = read_state(directory)
                if is_engine(record) and not kill_group(record.pid):  # vLLM's engine core and workers too
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(record.pid, signal.SIGKILL)
