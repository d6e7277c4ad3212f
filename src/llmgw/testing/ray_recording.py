"""Record what the real Ray CLI does, for the Ray stand-in's tests (``make record-ray``; root).

Runs the ``ray`` given (``make ray`` installs PyPI's ray into the cache) on
two machines made of network namespaces (:class:`llmgw.testing.netns.Machines`),
with the command lines llmgw's Ray launcher gives (:mod:`llmgw.engines.ray_launcher`),
and writes into the folder given, as ``ray-<version>-<what>.txt``:

- ``start-help``: ``ray start --help``;
- ``start-unknown-option``: ``ray start`` given an option it does not have;
- ``worker-head-only-option``: a worker given ``--include-dashboard`` (the head's only);
- ``head-start`` / ``worker-start``: the head's and the worker's output until they block;
- ``status``: ``ray status --address`` once both are in (one card each, ``--num-gpus``);
- ``worker-head-lost``: the worker's exit code, its time and its last words once every
  process of the head's machine was killed;
- ``worker-head-link-cut``: the same once the head's machine lost its link instead.

Each file starts with ``#`` lines naming its source (Ray's version, the command, when)
and, for a command that ended, its exit code and time. Lines of the raylet's
periodic state dump that Ray prints on a failure are left out (their count is said).

``python -m llmgw.testing.ray_recording DIR --ray RAY`` (about six minutes: the
link cut takes Ray four).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from llmgw.engines.ray_launcher import head_command, worker_command
from llmgw.testing.netns import Machines, usable

PORT = 29555
BLOCKED = "This command will now block forever"
LOST_WAIT_S = 600.0


def version(ray: str) -> str:
    """``2.60.0`` from ``ray --version`` (``ray, version 2.60.0``)."""
    out = subprocess.run([ray, "--version"], capture_output=True, text=True, timeout=120, check=True).stdout
    return out.strip().rpartition(" ")[2]


class Output:
    """A process's output, gathered as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self.started = time.monotonic()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 120) -> float:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {text!r} from {self.process.args!r}:\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.1)
        return time.monotonic() - self.started


class Recorder:
    def __init__(self, ray: str, folder: Path) -> None:
        self.ray = ray
        self.folder = folder
        self.version = version(ray)
        self.machines = Machines(f"rec{os.getpid() % 100000}")
        self.scratch = Path(tempfile.mkdtemp(prefix="llmgw-ray-rec-"))
        self.address = f"{self.machines.addresses[0]}:{PORT}"

    def write(self, what: str, header: list[str], lines: list[str]) -> None:
        dump = [line for line in lines if line.startswith("[state-dump]")]
        kept = [line for line in lines if not line.startswith("[state-dump]")]
        head = [
            f"# source: ray {self.version} (PyPI ray), {what}; recorded by make record-ray "
            f"(llmgw.testing.ray_recording) on {datetime.now(UTC):%Y-%m-%d}",
            *(f"# {line}" for line in header),
        ]
        if dump:
            head.append(f"# left out: {len(dump)} lines of the raylet's state dump")
        path = self.folder / f"ray-{self.version}-{what.split(':')[0]}.txt"
        path.write_text("\n".join([*head, *kept]) + "\n")
        print(f"wrote {path}", flush=True)

    def env(self, machine: int) -> dict[str, str]:
        return {**os.environ, "RAY_TMPDIR": str(self.scratch / "ab"[machine])}

    def run(self, machine: int, argv: list[str], timeout: float = 120) -> tuple[int, float, list[str]]:
        started = time.monotonic()
        done = subprocess.run(
            self.machines.argv(machine, *argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env(machine),
        )
        lines = (done.stdout + done.stderr).splitlines()
        return done.returncode, time.monotonic() - started, lines

    def start(self, machine: int, argv: list[str]) -> Output:
        process = subprocess.Popen(
            self.machines.argv(machine, *argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env(machine),
        )
        return Output(process)

    def cluster(self) -> tuple[Output, Output, float, float]:
        head = self.start(0, head_command(self.ray, self.address, cards=1))
        head_s = head.wait_for(BLOCKED)
        worker = self.start(1, worker_command(self.ray, self.address, self.machines.addresses[1], cards=1))
        worker_s = worker.wait_for(BLOCKED)
        return head, worker, head_s, worker_s

    def status_until(self, gpus: str) -> list[str]:
        deadline = time.monotonic() + 60
        while True:
            code, _, lines = self.run(0, [self.ray, "status", "--address", self.address])
            if code == 0 and any(line.strip().endswith(f"/{gpus} GPU") for line in lines):
                return lines
            if time.monotonic() > deadline:
                raise RuntimeError("ray status never showed the cluster:\n" + "\n".join(lines))
            time.sleep(1)

    def worker_exit(self, worker: Output) -> tuple[int, float]:
        lost_at = time.monotonic()
        code = worker.process.wait(LOST_WAIT_S)
        time.sleep(0.5)  # the reader's last lines
        return code, time.monotonic() - lost_at

    def record(self) -> None:
        self.machines.make()
        try:
            self._record()
        finally:
            self.machines.remove()
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _record(self) -> None:
        code, _, lines = self.run(0, [self.ray, "start", "--help"])
        self.write("start-help: ray start --help", [f"exit: code {code}"], lines)
        argv = [self.ray, "start", "--head", "--no-such-option", "--block"]
        code, _, lines = self.run(0, argv)
        self.write("start-unknown-option", [f"command: {_shown(argv)}", f"exit: code {code}"], lines)
        argv = [*worker_command(self.ray, self.address, self.machines.addresses[1], 1)]
        argv[-1:-1] = ["--include-dashboard", "false"]
        code, _, lines = self.run(1, argv)
        self.write("worker-head-only-option", [f"command: {_shown(argv)}", f"exit: code {code}"], lines)

        head, worker, head_s, worker_s = self.cluster()
        self.write(
            "head-start: llmgw's head command",
            [f"command: {_shown(head.process.args)}", f"blocked after {head_s:.1f} s"],
            head.lines,
        )
        self.write(
            "worker-start: llmgw's worker command",
            [f"command: {_shown(worker.process.args)}", f"blocked after {worker_s:.1f} s"],
            worker.lines,
        )
        lines = self.status_until("2.0")
        self.write("status: ray status --address, a head and a worker with one card each", [], lines)
        self.machines.kill_all(0)
        code, taken = self.worker_exit(worker)
        self.write(
            "worker-head-lost: the worker once every process of the head's machine was killed",
            [f"command: {_shown(worker.process.args)}", f"exit: code {code} after {taken:.1f} s"],
            worker.lines,
        )

        head, worker, _, _ = self.cluster()
        self.status_until("2.0")
        self.machines.link(0, up=False)
        code, taken = self.worker_exit(worker)
        self.write(
            "worker-head-link-cut: the worker once the head's machine lost its link",
            [f"command: {_shown(worker.process.args)}", f"exit: code {code} after {taken:.1f} s"],
            worker.lines,
        )


def _shown(argv: object) -> str:
    words = [str(word) for word in argv] if isinstance(argv, list) else [str(argv)]
    if words[:3] == ["ip", "netns", "exec"]:
        words = words[4:]
    return " ".join(["ray", *words[1:]] if words and words[0].endswith("/ray") else words)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.testing.ray_recording", description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--ray", required=True, help="the ray program to record (make ray installs one)")
    options = parser.parse_args(argv)
    why = usable()
    if why:
        print(f"ray_recording: {why}", file=sys.stderr)
        return 2
    Recorder(options.ray, options.folder).record()
    return 0


if __name__ == "__main__":
    sys.exit(main())
