"""llmgw's launcher for the shards of a multi-node vLLM replica: Ray first, then vLLM.

vLLM spans nodes over a Ray cluster (its docs: ``ray start --head`` on the
head node, ``ray start --address=HEAD:PORT`` on the others, then ``vllm serve
… --distributed-executor-backend ray`` on the head; vLLM waits until the
cluster holds the cards its placement group asks for). Each shard is one
process the agent supervises, so this launcher makes one process of each role:

- head (rank 0): ``python -m llmgw.engines.ray_launcher --ray RAY --head
  --address HOST:PORT -- vllm serve …`` starts ``RAY start --head --port PORT
  …  --block`` (:func:`head_command`), waits until that port takes
  connections, then starts vLLM with ``RAY_ADDRESS=HOST:PORT`` (which
  ``ray.init`` joins). vLLM serves the replica's port itself.
- worker (rank 1, 2, …): ``python -m llmgw.engines.ray_launcher --ray RAY
  --address HOST:PORT --host H --port P`` waits until the head's port takes
  connections (:data:`JOIN_WAIT_S` at most), starts ``RAY start --address
  HOST:PORT … --block`` (:func:`worker_command`) and answers ``GET /health`` on
  ``H:P`` (200 while Ray runs and the head's port takes connections, 503
  otherwise), so the agent health-checks a worker as it does any engine.

Both pass Ray the node's own address (``--node-ip-address``: the host of the
rendezvous address on the head, ``--host`` on a worker; left to itself Ray
guesses it from a route to the internet or the host name, wrong on a node with
several addresses), the cards the agent gave the shard (``--num-gpus``: as many
as ``CUDA_VISIBLE_DEVICES`` names, which Ray would count the same on a node with
cards; none given on a node without any: Ray counts its CPUs) and
``--disable-usage-stats`` (Ray reports usage to its makers unless told not to);
the head starts without Ray's dashboard (``--include-dashboard false``: vLLM
does not use it, and two heads on one node would both want its port).

The launcher ends when any of its children ends, with that child's exit code,
after stopping the other; SIGTERM is passed on to the children, and a launcher
killed outright takes them with it (``PR_SET_PDEATHSIG``), so a killed shard
leaves no Ray node behind in the cluster. It is its descendants' subreaper
(``PR_SET_CHILD_SUBREAPER``) and ends whatever is left below it on its way out
(:func:`end_descendants`): Ray's dashboard and runtime-env agents outlive a
``ray start`` killed while it drains.

A worker watches its head itself: Ray's own worker outlives its head for a
long while (Ray 2.60's raylet gives up on the cluster's GCS only after 60 s
without it, measured at 1 to 4 minutes after the head went:
tests/engines/data/ray-2.60.0-worker-head-lost.txt). Once the head's port has
taken no connection for :data:`HEAD_LOST_S` (one try each :data:`PROBE_S`, of
at most :data:`PROBE_TIMEOUT_S`), the worker kills its Ray node's processes (a
graceful ``ray stop`` would drain for up to 30 s towards a cluster that is
gone) and exits with code 1, so the agent sees the shard fail between
``HEAD_LOST_S - PROBE_S`` and ``HEAD_LOST_S + PROBE_S + PROBE_TIMEOUT_S`` (9 to 12 s)
after the head went, and the replica is taken down and placed again.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a child gets when its parent ends."""
PR_SET_CHILD_SUBREAPER = 36
"""prctl(2): orphaned descendants are reparented to this process."""
LEFTOVER_GRACE_S = 5.0
"""How long processes left below the launcher at its end get after SIGTERM, before SIGKILL."""
HEAD_WAIT_S = 120.0
"""How long the head waits for its own Ray port before it gives up."""
JOIN_WAIT_S = 120.0
"""How long a worker waits for the head's port to take a connection before it gives up (exit 1)."""
HEAD_LOST_S = 10.0
"""How long a worker's head may take no connection before the worker exits (code 1)."""
PROBE_S = 1.0
"""How often a worker tries the head's port."""
PROBE_TIMEOUT_S = 1.0
"""How long one try may take (a head whose link is gone answers nothing, not even a refusal)."""
HEAD_LOST_EXIT = 1
NO_RAY_EXIT = 2


def reachable(address: str, timeout: float = 1.0) -> bool:
    """True when ``HOST:PORT`` takes a TCP connection now."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def cards_given(environ: Mapping[str, str]) -> int | None:
    """The cards ``CUDA_VISIBLE_DEVICES`` names; None where it names none (a node without cards)."""
    cards = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return len(cards) or None


def _node_options(node_ip: str, cards: int | None) -> list[str]:
    options = ["--node-ip-address", node_ip, "--disable-usage-stats"]
    if cards is not None:
        options += ["--num-gpus", str(cards)]
    return options


def head_command(ray: str, address: str, cards: int | None = None) -> list[str]:
    """``ray start --head --port PORT … --block``: the cluster's head, in the foreground."""
    host, _, port = address.rpartition(":")
    return [
        ray, "start", "--head", "--port", port, *_node_options(host.strip("[]"), cards),
        "--include-dashboard", "false", "--block",
    ]  # fmt: skip


def worker_command(ray: str, address: str, node_ip: str, cards: int | None = None) -> list[str]:
    """``ray start --address HOST:PORT … --block``: join the head's cluster, in the foreground."""
    return [ray, "start", "--address", address, *_node_options(node_ip, cards), "--block"]


def _die_with_parent() -> None:
    """In a child, before it runs: end it (SIGTERM) when the launcher ends, even by SIGKILL (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the children are stopped on the launcher's way out only


def _spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _first_to_end(processes: list[subprocess.Popen[bytes]]) -> int:
    """Wait until one of ``processes`` ends, stop the rest, return the first's exit code."""
    ended = threading.Event()

    def wait(process: subprocess.Popen[bytes]) -> None:
        process.wait()
        ended.set()

    for process in processes:
        threading.Thread(target=wait, args=(process,), daemon=True).start()
    ended.wait()
    code = next(p.returncode for p in processes if p.returncode is not None)
    for process in processes:
        _stop(process)
    return code


def run_head(ray: str, address: str, engine: list[str]) -> int:
    cluster = _spawn(head_command(ray, address, cards_given(os.environ)))
    deadline = time.monotonic() + HEAD_WAIT_S
    while not reachable(address):
        if cluster.poll() is not None:
            print(f"ray head exited with code {cluster.returncode} before it listened", file=sys.stderr)
            return cluster.returncode or 1
        if time.monotonic() > deadline:
            print(f"ray head did not listen on {address} within {HEAD_WAIT_S:.0f} s", file=sys.stderr)
            _stop(cluster)
            return 1
        time.sleep(0.1)
    server = _spawn(engine, {**os.environ, "RAY_ADDRESS": address})
    _pass_on_sigterm([cluster, server])
    return _first_to_end([cluster, server])


def run_worker(
    ray: str,
    address: str,
    host: str,
    port: int,
    head_lost_s: float = HEAD_LOST_S,
    join_wait_s: float = JOIN_WAIT_S,
) -> int:
    member: list[subprocess.Popen[bytes]] = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/health" and bool(member) and member[0].poll() is None and reachable(address)
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        if not _wait_reachable(address, join_wait_s):
            print(f"ray head at {address} took no connection within {join_wait_s:.0f} s", file=sys.stderr)
            return HEAD_LOST_EXIT
        node = _spawn(worker_command(ray, address, host, cards_given(os.environ)))
        member.append(node)
        _pass_on_sigterm(member)
        ended = threading.Event()
        threading.Thread(target=_set_when_ended, args=(node, ended), daemon=True).start()
        threading.Thread(target=_watch_head, args=(address, head_lost_s, ended), daemon=True).start()
        ended.wait()
        if node.poll() is None:  # the head is gone: there is no cluster left to leave gracefully
            print(
                f"ray head at {address} took no connection for {head_lost_s:.0f} s: "
                "this node leaves the cluster",
                file=sys.stderr,
                flush=True,
            )
            end_descendants(grace_s=0)
            node.wait()
            return HEAD_LOST_EXIT
        return node.returncode
    finally:
        server.shutdown()


def _set_when_ended(process: subprocess.Popen[bytes], ended: threading.Event) -> None:
    process.wait()
    ended.set()


def _wait_reachable(address: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not reachable(address, timeout=PROBE_TIMEOUT_S):
        if time.monotonic() > deadline:
            return False
        time.sleep(PROBE_S)
    return True


def _watch_head(address: str, lost_s: float, lost: threading.Event) -> None:
    """Set ``lost`` once the head's port has taken no connection for ``lost_s`` (or ``lost`` is set)."""
    last_seen = time.monotonic()
    while not lost.is_set():
        if reachable(address, timeout=PROBE_TIMEOUT_S):
            last_seen = time.monotonic()
        elif time.monotonic() - last_seen >= lost_s:
            lost.set()
            return
        time.sleep(PROBE_S)


def _children_by_parent() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux's /proc; none elsewhere), nearest first."""
    if not os.path.isdir("/proc"):
        return []
    children = _children_by_parent()
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(children.get(child, []))
    return out


def end_descendants(grace_s: float = LEFTOVER_GRACE_S) -> None:
    """End every process left below the launcher: SIGTERM, then SIGKILL after ``grace_s`` (at once
    with 0). The launcher is their subreaper, so a Ray process whose parent ended is still found."""
    first = signal.SIGKILL if grace_s <= 0 else signal.SIGTERM
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, first)
    deadline = time.monotonic() + grace_s
    while descendants(os.getpid()):
        _reap()
        if time.monotonic() > deadline:
            for pid in descendants(os.getpid()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def _reap() -> None:
    """Collect ended children (the subreaper's orphans among them), so they leave /proc."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _become_subreaper() -> None:
    """Linux: orphans below the launcher are reparented to it (not to init), so it can end them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def _pass_on_sigterm(processes: list[subprocess.Popen[bytes]]) -> None:
    def stop(signum: int, frame: object) -> None:
        for process in processes:
            if process.poll() is None:
                process.terminate()

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    engine: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, engine = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="python -m llmgw.engines.ray_launcher", description=__doc__)
    parser.add_argument("--ray", required=True, help="the ray program of the vLLM build")
    parser.add_argument("--address", required=True, help="HOST:PORT of the Ray head")
    parser.add_argument("--head", action="store_true", help="start the head, then the command after --")
    parser.add_argument("--host", default="127.0.0.1", help="worker: where /health is answered")
    parser.add_argument("--port", type=int, default=0, help="worker: the shard's port")
    parser.add_argument(
        "--head-lost-s",
        type=float,
        default=HEAD_LOST_S,
        help=f"worker: exit once the head's port has taken no connection for this long ({HEAD_LOST_S:.0f} s)",
    )
    options = parser.parse_args(argv)
    if options.head and not engine:
        parser.error("the head needs the engine's command after --")
    if not options.head and not options.port:
        parser.error("a worker needs --port, where the agent checks its health")
    if not (os.path.isfile(options.ray) and os.access(options.ray, os.X_OK)):
        print(
            f"ray_launcher: no ray program at {options.ray}: a multi-node vLLM replica runs the ray "
            "installed beside vLLM in its build; install it there (pip install ray in the build's "
            'virtualenv; docs/engines.md, "Several nodes")',
            file=sys.stderr,
        )
        return NO_RAY_EXIT
    _become_subreaper()
    try:
        if options.head:
            return run_head(options.ray, options.address, engine)
        return run_worker(options.ray, options.address, options.host, options.port, options.head_lost_s)
    finally:
        end_descendants()  # what Ray left behind (its agents outlive a ray start killed while draining)


if __name__ == "__main__":
    sys.exit(main())
