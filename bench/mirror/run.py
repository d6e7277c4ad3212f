"""Mirror benchmark: importing a file into the mirror and a node fetching it, against sha256sum and cp.

One file of random bytes (2 GiB by default) in a temporary folder on one
disk (``--dir``, /var/tmp by default); in the same run, on that file:

- ``sha256sum FILE`` and ``cp FILE COPY`` (and ``cp`` then ``sync COPY``,
  the copy made durable as the mirror makes its own), timed;
- the import: ``BlobStore.import_file`` (``mirror/blobs.py``) in a process of
  its own, timed inside it (no interpreter start-up);
- the node's fetch: a control plane's gRPC server (``AgentServer`` of
  ``protocol/grpc_transport.py``, mutual TLS with certificates of a cluster CA
  made for the run, on 127.0.0.1) serving the blob from that store, and, in
  another process, the agent's own fetch (``Installer.blob`` of
  ``agent/installing.py`` over ``GrpcConnector.fetch``: ``BlobWriter``,
  resume, sha256 check, the digest record), timed inside that process.

Each of our processes reports its peak RSS. Prints MB/s for each and ends
with one JSON line of figures, ratios and goals (``figures.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import FETCH_GOAL, IMPORT_GOAL, Timings, json_line, rate

GIB = 1 << 30
WRITE_CHUNK = 8 << 20


def peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_file(path: Path, size: int) -> None:
    with path.open("wb") as out:
        left = size
        while left:
            piece = os.urandom(min(WRITE_CHUNK, left))
            out.write(piece)
            left -= len(piece)
        out.flush()
        os.fsync(out.fileno())


def timed(command: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, done.stdout


def make_pki(directory: Path) -> None:
    from llmgw.pki.authority import Authority
    from llmgw.protocol.grpc_transport import SERVER_NAME

    authority = Authority.create(directory / "ca")
    authority.issue("cp1", sans=[SERVER_NAME, "127.0.0.1"], usage="both", directory=directory, stem="server")
    authority.issue("node-1", sans=[], usage="client", directory=directory, stem="node")


def tls(directory: Path, stem: str):  # type: ignore[no-untyped-def]
    from llmgw.protocol.grpc_transport import TlsFiles

    return TlsFiles(directory / "ca" / "ca.crt", directory / f"{stem}.crt", directory / f"{stem}.key")


# the processes the benchmark starts: each prints one JSON line


def role_import(store: Path, source: Path) -> None:
    from llmgw.mirror.blobs import BlobStore

    started = time.perf_counter()
    info = asyncio.run(BlobStore(store).import_file(source))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "sha256": info.sha256, "rss": peak_rss()}), flush=True)


def role_serve(store: Path, pki: Path) -> None:
    """Serve the store's blobs until stdin closes; print the port, then (at the end) the peak RSS."""
    from llmgw.mirror.blobs import BlobStore
    from llmgw.protocol.grpc_transport import AgentServer

    blobs = BlobStore(store)

    async def no_session(channel: object) -> None:
        raise RuntimeError("this benchmark opens no agent session")

    async def serve() -> None:
        server = AgentServer(
            no_session,  # type: ignore[arg-type]
            lambda node, sha256, offset: blobs.read_chunks(sha256, offset),
            tls(pki, "server"),
            "127.0.0.1",
            0,
        )
        port = await server.start()
        print(json.dumps({"port": port}), flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await server.stop()

    asyncio.run(serve())
    print(json.dumps({"rss": peak_rss()}), flush=True)


def role_fetch(target: str, pki: Path, work: Path, sha256: str, size: int) -> None:
    from llmgw.agent.config import AgentConfig
    from llmgw.agent.installing import Installer
    from llmgw.core.devices import NodeInventory
    from llmgw.protocol.grpc_client import GrpcConnector

    config = AgentConfig(node_id="node-1", control_planes=[target], work_dir=str(work))
    connector = GrpcConnector(target, tls(pki, "node"))
    installer = Installer(config, lambda: NodeInventory(node_id="node-1"), lambda: connector.fetch)
    started = time.perf_counter()
    path = asyncio.run(installer.blob("bench", sha256, "bench.bin", size))
    seconds = time.perf_counter() - started
    assert path.stat().st_size == size
    print(json.dumps({"seconds": seconds, "rss": peak_rss()}), flush=True)


PROFILE_DIR = ""
"""Where py-spy's collapsed stacks of each child go (``--profile``); empty: no profiling."""


def child(*args: str) -> list[str]:
    command = [sys.executable, __file__, "--role", *args]
    if not PROFILE_DIR:
        return command
    spy = str(Path(sys.executable).with_name("py-spy"))
    out = str(Path(PROFILE_DIR) / f"{args[0]}.txt")
    return [spy, "record", "--format", "raw", "--rate", "250", "--gil", "-o", out, "--", *command]


def last_json(output: str) -> dict[str, object]:
    lines = [line for line in output.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=2.0, help="the file's size (default 2 GiB)")
    parser.add_argument("--dir", default="/var/tmp", help="where the temporary folder goes (one disk)")
    parser.add_argument("--repeats", type=int, default=3, help="turns of every step; the best counts")
    parser.add_argument("--profile", default="", help="write py-spy's collapsed stacks of each process here")
    args = parser.parse_args()
    global PROFILE_DIR
    PROFILE_DIR = str(Path(args.profile).resolve()) if args.profile else ""
    size = int(args.size_gib * GIB)
    root = Path(tempfile.mkdtemp(prefix="llmgw-bench-mirror-", dir=args.dir))
    try:
        run(root, size, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, size: int, repeats: int) -> None:
    """Each step ``repeats`` times, the steps taking turns (so a busy moment slows them all); the best
    time of each counts, the peak RSS is the highest seen."""
    source, copy = root / "source.bin", root / "copy.bin"
    print(f"writing {size / GIB:g} GiB of random bytes to {source}", flush=True)
    make_file(source, size)
    pki, store, node = root / "pki", root / "mirror", root / "node"
    make_pki(pki)
    best: dict[str, float] = {}
    rss = {"import": 0, "fetch": 0, "server": 0}

    def keep(step: str, seconds: float, note: str = "") -> None:
        best[step] = min(seconds, best.get(step, seconds))
        print(f"  {step:<10} {rate(size, seconds):8.0f} MB/s{note}", flush=True)

    digest = ""
    server = subprocess.Popen(
        child("serve", str(store), str(pki)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        line = server.stdout.readline()
        while line and not line.startswith("{"):  # py-spy's own lines, when profiling
            line = server.stdout.readline()
        port = json.loads(line)["port"]
        for turn in range(1, repeats + 1):
            print(f"turn {turn} of {repeats}", flush=True)
            seconds, out = timed(["sha256sum", str(source)])
            digest = out.split()[0]
            keep("sha256sum", seconds)
            keep("cp", timed(["cp", str(source), str(copy)])[0])
            copy.unlink()
            started = time.perf_counter()
            subprocess.run(["cp", str(source), str(copy)], check=True)
            subprocess.run(["sync", str(copy)], check=True)
            keep("cp + sync", time.perf_counter() - started)
            copy.unlink()

            shutil.rmtree(store, ignore_errors=True)
            done = last_json(_output(child("import", str(store), str(source))))
            assert done["sha256"] == digest, "the import's sha256 differs from sha256sum's"
            rss["import"] = max(rss["import"], int(done["rss"]))  # type: ignore[call-overload]
            keep("import", float(done["seconds"]), f"  (peak RSS {int(done['rss']) / 1e6:.0f} MB)")  # type: ignore[call-overload, arg-type]

            shutil.rmtree(node, ignore_errors=True)
            done = last_json(
                _output(child("fetch", f"127.0.0.1:{port}", str(pki), str(node), digest, str(size)))
            )
            rss["fetch"] = max(rss["fetch"], int(done["rss"]))  # type: ignore[call-overload]
            keep("node fetch", float(done["seconds"]), f"  (peak RSS {int(done['rss']) / 1e6:.0f} MB)")  # type: ignore[call-overload, arg-type]
        server.stdin.close()
        rss["server"] = int(last_json(server.stdout.read())["rss"])  # type: ignore[call-overload]
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

    timings = Timings(
        size,
        best["sha256sum"],
        best["cp"],
        best["cp + sync"],
        best["import"],
        best["node fetch"],
        rss["import"],
        rss["fetch"],
        rss["server"],
    )
    line = json_line(timings)
    figures = json.loads(line)
    print(f"best of {repeats}:")
    for step in best:
        print(f"  {step:<10} {rate(size, best[step]):8.0f} MB/s")
    print(
        f"  peak RSS: import {rss['import'] / 1e6:.0f} MB, fetch {rss['fetch'] / 1e6:.0f} MB, "
        f"server {rss['server'] / 1e6:.0f} MB"
    )
    print(
        f"import / sha256sum {figures['import_vs_sha256sum']:.2f} (goal >= {IMPORT_GOAL}); "
        f"fetch / cp {figures['fetch_vs_cp']:.2f}, / cp + sync {figures['fetch_vs_cp_sync']:.2f} "
        f"(goal >= {FETCH_GOAL}); goals met: {figures['goals']}"
    )
    print(line)


def _output(command: list[str]) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, rest = sys.argv[2], sys.argv[3:]
        if role == "import":
            role_import(Path(rest[0]), Path(rest[1]))
        elif role == "serve":
            role_serve(Path(rest[0]), Path(rest[1]))
        elif role == "fetch":
            role_fetch(rest[0], Path(rest[1]), Path(rest[2]), rest[3], int(rest[4]))
    else:
        main()
