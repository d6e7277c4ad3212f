"""llmgw's launcher for the shards of a multi-node vLLM replica: Ray first, then vLLM.

vLLM spans nodes over a Ray cluster (its docs: ``ray start --head`` on the
head node, ``ray start --address=HEAD:PORT`` on the others, then ``vllm serve
… --distributed-executor-backend ray`` on the head; vLLM waits until the
cluster holds the cards its placement group asks for). Each shard is one
process the agent supervises, so this launcher makes one process of each role:

- head (rank 0): ``python -m llmgw.engines.ray_launcher --ray RAY --head
  --address HOST:PORT -- vllm serve …`` starts ``RAY start --head --port PORT
  --block``, waits until that port takes connections, then starts vLLM with
  ``RAY_ADDRESS=HOST:PORT`` (which ``ray.init`` joins). vLLM serves the
  replica's port itself.
- worker (rank 1, 2, …): ``python -m llmgw.engines.ray_launcher --ray RAY
  --address HOST:PORT --host H --port P`` starts ``RAY start --address
  HOST:PORT --block`` and answers ``GET /health`` on ``H:P`` (200 while Ray
  runs and the head's port takes connections, 503 otherwise), so the agent
  health-checks a worker as it does any engine.

The launcher ends when any of its children ends, with that child's exit code,
after stopping the other; SIGTERM is passed on to the children, and a launcher
killed outright takes them with it (``PR_SET_PDEATHSIG``), so a killed shard
leaves no Ray node behind in the cluster. A worker whose
head goes away exits (its ``ray start`` loses the cluster), so the agent sees
the shard fail and the replica is taken down and placed again.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a child gets when its parent ends."""
HEAD_WAIT_S = 120.0
"""How long the head waits for its own Ray port before it gives up."""


def reachable(address: str, timeout: float = 1.0) -> bool:
    """True when ``HOST:PORT`` takes a TCP connection now."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def head_command(ray: str, address: str) -> list[str]:
    """``ray start --head --port PORT --block``: the cluster's head, in the foreground."""
    return [ray, "start", "--head", "--port", address.rpartition(":")[2], "--block"]


def worker_command(ray: str, address: str) -> list[str]:
    """``ray start --address HOST:PORT --block``: join the head's cluster, in the foreground."""
    return [ray, "start", "--address", address, "--block"]


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
    cluster = _spawn(head_command(ray, address))
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


def run_worker(ray: str, address: str, host: str, port: int) -> int:
    member = _spawn(worker_command(ray, address))

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/health" and member.poll() is None and reachable(address)
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _pass_on_sigterm([member])
    try:
        return _first_to_end([member])
    finally:
        server.shutdown()


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
    options = parser.parse_args(argv)
    if options.head:
        if not engine:
            parser.error("the head needs the engine's command after --")
        return run_head(options.ray, options.address, engine)
    if not options.port:
        parser.error("a worker needs --port, where the agent checks its health")
    return run_worker(options.ray, options.address, options.host, options.port)


if __name__ == "__main__":
    sys.exit(main())
