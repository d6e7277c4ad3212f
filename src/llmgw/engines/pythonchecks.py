"""Proving a vLLM or SGLang build computes here, in the build's own Python (C4.2, C4.4).

A build first has to run as serving runs it (:func:`runs_command`: ``vllm
--version``; ``python -m sglang.launch_server --help``; for vLLM's CPU build,
importing its OpenAI server, which imports transformers and torch as serving
does). Then :data:`PROBE` runs in its Python and reports what it saw, which
:func:`python_verdict` judges:

- A CUDA build must import its compiled extension (``vllm._C``;
  ``sgl_kernel``, which loads the kernels for the card's architecture) and
  its torch must see the card (``torch.cuda.is_available()``,
  ``torch.cuda.device_count()``). Nothing is allocated on a card, so a card
  busy serving other replicas does not fail the check.
- vLLM's CPU build must run one of its own compiled CPU kernels,
  ``torch.ops._C.rms_norm``, to the right numbers. That is the cheapest
  honest proof its kernels compute here: a CPU without the instructions they
  were compiled for dies on the call (``SIGILL``), a wrong build computes
  wrong numbers. The other proofs cost far more and prove nothing more
  about the kernels: a served engine start is 70 to 150 s of compiling on a
  CPU (docs/engines.md), and even a tiny offline generation (a random
  two-layer model written on the node, ``enforce_eager``, three processes)
  took 21 s here before its first step. Measured here (two cores, shared
  with other work): the whole check takes 15 to 16 s, of which the import of
  the OpenAI server is about 10 s and the probe about 5 s.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from llmgw.engines.buildverdicts import CheckResult
from llmgw.engines.checking import run_command

EXTENSIONS = {"vllm": "vllm._C", "sglang": "sgl_kernel"}
"""Each engine's compiled extension, the module its kernels are in."""
LABELS = {"vllm": "vLLM", "sglang": "SGLang"}
CHECK_TIMEOUT_S = 300.0

PROBE = r"""
import importlib, json, sys
extension, mode = sys.argv[1], sys.argv[2]
seen = {"mode": mode, "extension": extension}
def done():
    print(json.dumps(seen))
    sys.exit(0)
try:
    import torch
except Exception as error:
    seen["torch_error"] = f"{type(error).__name__}: {error}"
    done()
seen["torch"] = str(torch.__version__)
seen["cuda"] = getattr(torch.version, "cuda", None)
if mode == "cuda":
    seen["available"] = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if seen["available"] else 0
    seen["devices"] = [str(torch.cuda.get_device_name(i)) for i in range(count)]
try:
    importlib.import_module(extension)
except Exception as error:
    seen["extension_error"] = f"{type(error).__name__}: {error}"
    done()
if mode == "cpu":
    rows = [[(i * 7 + r * 3) % 11 - 5.0 for i in range(64)] for r in range(2)]
    weight = [1.0 + i / 64 for i in range(64)]
    expected = [
        [x * w / (sum(v * v for v in row) / len(row) + 1e-6) ** 0.5 for x, w in zip(row, weight)]
        for row in rows
    ]
    x = torch.tensor(rows, dtype=torch.float32)
    out = torch.empty_like(x)
    try:
        torch.ops._C.rms_norm(out, x, torch.tensor(weight, dtype=torch.float32), 1e-6)
    except Exception as error:
        seen["kernel_error"] = f"{type(error).__name__}: {error}"
        done()
    got = out.tolist()
    seen["kernel_difference"] = max(abs(a - b) for g, e in zip(got, expected) for a, b in zip(g, e))
done()
"""
"""Run as ``python -c PROBE EXTENSION cuda|cpu``; its last line is what it saw, as JSON."""

KERNEL_TOLERANCE = 1e-3


def python_of(program: Path) -> Path:
    """The Python a build's program runs on: itself, the ``python`` beside it, or its ``#!`` line's."""
    if program.name.startswith("python"):
        return program
    beside = program.parent / "python"
    if beside.exists():
        return beside
    try:
        first = program.read_bytes()[:200].split(b"\n", 1)[0]
    except OSError:
        return beside
    return Path(first[2:].decode(errors="replace").strip()) if first.startswith(b"#!") else beside


def runs_command(program: Path, engine: str, *, gpu: bool) -> list[str]:
    """What proves the build runs as serving runs it (the check before the compute probe)."""
    if engine == "vllm" and not gpu:
        return [str(python_of(program)), "-c", "import vllm.entrypoints.openai.api_server"]
    if engine == "vllm":
        return [str(program), "--version"]
    return [str(python_of(program)), "-m", "sglang.launch_server", "--help"]


def _exit(code: int) -> str:
    if code < 0 and -code in signal.Signals._value2member_map_:
        name = signal.Signals(-code).name
        why = " (an instruction this CPU lacks)" if name == "SIGILL" else ""
        return f"killed by {name}{why}"
    return f"exit {code}"


def _last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                seen = json.loads(line)
            except ValueError:
                return None
            return seen if isinstance(seen, dict) else None
    return None


def python_verdict(engine: str, program: Path, *, gpu: bool, code: int, output: str) -> CheckResult:
    """Judge what :data:`PROBE` printed (exit status ``code``, ``output``) for ``engine``'s build."""
    label = LABELS.get(engine, engine)
    where = f"{label} at {program}"
    reinstall = "the build does not compute here; at install the next build is tried"
    seen = _last_json(output)
    if seen is None:
        tail = output.strip().splitlines()[-1] if output.strip() else "no output"
        return CheckResult(False, f"{where}: its Python failed the check ({_exit(code)}): {tail}", reinstall)
    if "torch_error" in seen:
        return CheckResult(False, f"{where}: torch does not import: {seen['torch_error']}", reinstall)
    torch = f"torch {seen.get('torch')}" + (f" (CUDA {seen['cuda']})" if seen.get("cuda") else "")
    if gpu:
        fit = (
            "the build does not fit this node's driver or cards (CUDA 13 builds need driver 580 or "
            "newer; check that 'nvidia-smi' answers); at install the next build is tried"
        )
        devices = seen.get("devices") or []
        if not seen.get("available") or not devices:
            return CheckResult(False, f"{where}: {torch} sees no card", fit)
        if "extension_error" in seen:
            return CheckResult(
                False, f"{where}: {seen['extension']} does not import: {seen['extension_error']}", fit
            )
        names = ", ".join(sorted(set(devices)))
        return CheckResult(
            True, f"{where}: {seen['extension']} imports and {torch} sees {len(devices)} card(s): {names}"
        )
    if "extension_error" in seen:
        return CheckResult(
            False, f"{where}: {seen['extension']} does not import: {seen['extension_error']}", reinstall
        )
    if "kernel_error" in seen:
        failed = seen["kernel_error"]
        return CheckResult(False, f"{where}: its CPU kernel rms_norm failed: {failed}", reinstall)
    difference = float(seen.get("kernel_difference", float("inf")))
    if difference > KERNEL_TOLERANCE:
        wrong = f"its CPU kernel rms_norm computed wrong numbers (off by {difference:g})"
        return CheckResult(False, f"{where}: {wrong}", reinstall)
    return CheckResult(True, f"{where}: its CPU kernel rms_norm computes on this CPU ({torch})")


async def check_python_build(
    program: Path, engine: str, *, gpu: bool, timeout_s: float = CHECK_TIMEOUT_S
) -> CheckResult:
    """``program``'s build (vLLM or SGLang) runs, and computes on the card (``gpu``) or this CPU."""
    label = LABELS.get(engine, engine)
    gpu = gpu or engine != "vllm"  # only vLLM has a CPU build
    code, output = await run_command(runs_command(program, engine, gpu=gpu), timeout_s)
    if code != 0:
        tail = output.strip().splitlines()[-1] if output.strip() else "no output"
        return CheckResult(
            False,
            f"{label} does not start with {program} ({_exit(code)}): {tail}",
            f"reinstall {label} there, or leave engines.{engine}.program empty and let the agent install a "
            "build (at install, a build that does not start is refused and the next one tried)",
        )
    mode = "cuda" if gpu else "cpu"
    probe = [str(python_of(program)), "-c", PROBE, EXTENSIONS.get(engine, engine), mode]
    code, output = await run_command(probe, timeout_s)
    return python_verdict(engine, program, gpu=gpu, code=code, output=output)
