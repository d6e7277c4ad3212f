"""Executables standing in for the engines' own, for the agent to launch exactly as the real ones.

:func:`write_standins` puts, in one folder:

- ``vllm``: the ``vllm`` command of a vLLM build (→ :mod:`llmgw.testing.fake_vllm`);
- ``python``: a build's Python that runs ``-m sglang.launch_server`` as
  :mod:`llmgw.testing.fake_sglang` and anything else as this Python;
- ``trtllm-serve`` beside that ``python``: the operator's TensorRT-LLM
  (→ :mod:`llmgw.testing.fake_trtllm`), so ``engines.trtllm.python`` can name it.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StandinPrograms:
    vllm: Path
    python: Path
    trtllm_serve: Path


def _write(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def write_standins(directory: Path, python: str = sys.executable) -> StandinPrograms:
    directory.mkdir(parents=True, exist_ok=True)
    py = shlex.quote(python)
    vllm = _write(directory / "vllm", f'exec {py} -m llmgw.testing.fake_vllm "$@"')
    wrapper = _write(
        directory / "python",
        'if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then shift 2; '
        f'exec {py} -m llmgw.testing.fake_sglang "$@"; fi\n'
        f'exec {py} "$@"',
    )
    trtllm = _write(directory / "trtllm-serve", f'exec {py} -m llmgw.testing.fake_trtllm "$@"')
    return StandinPrograms(vllm=vllm, python=wrapper, trtllm_serve=trtllm)
