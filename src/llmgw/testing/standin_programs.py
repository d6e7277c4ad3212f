"""Executables standing in for the engines' own, for the agent to launch exactly as the real ones.

:func:`write_standins` puts, in one folder:

- ``vllm``: the ``vllm`` command of a vLLM build (→ :mod:`llmgw.testing.vllm_standin`);
- ``ray`` beside it: Ray's ``ray start`` for a multi-node vLLM replica (→ :mod:`llmgw.testing.ray_standin`);
- ``python``: a build's Python that runs ``-m sglang.launch_server`` as
  :mod:`llmgw.testing.sglang_standin` and anything else as this Python;
- ``trtllm-serve`` beside that ``python``: the operator's TensorRT-LLM
  (→ :mod:`llmgw.testing.trtllm_standin`), so ``engines.trtllm.python`` can name it;
- ``comfyui/main.py``: ComfyUI's ``main.py``, run by that ``python``
  (→ :mod:`llmgw.testing.comfyui_standin`), for ``engines.comfyui.main``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent.config import EngineSettings, PythonEngineSettings, TrtllmSettings


@dataclass(frozen=True)
class StandinPrograms:
    vllm: Path
    python: Path
    trtllm_serve: Path
    comfyui_main: Path
    ray: Path

    def engine_settings(self) -> EngineSettings:
        """An agent's engine settings that run vLLM, SGLang and TensorRT-LLM as these stand-ins."""
        return EngineSettings(
            vllm=PythonEngineSettings(program=str(self.vllm)),
            sglang=PythonEngineSettings(program=str(self.python)),
            trtllm=TrtllmSettings(python=str(self.python)),
        )


def _write(path: Path, python: str, body: str) -> Path:
    """A Python script run through its ``#!`` line, as a console script such as ``vllm`` is.

    So ``/proc`` shows it as the real one shows (``python /…/vllm serve …``)
    and the agent recognises an engine it started after restarting.
    """
    # The stand-in runs the llmgw that wrote it, whatever the engine's environment says.
    source = str(Path(__file__).resolve().parents[2])
    path.write_text(f"#!{python}\nimport sys\nsys.path.insert(0, {source!r})\n{body}\n")
    path.chmod(0o755)
    return path


def _module(name: str) -> str:
    return f"import runpy\nrunpy.run_module({name!r}, run_name='__main__', alter_sys=True)"


def write_standins(directory: Path, python: str = sys.executable) -> StandinPrograms:
    directory.mkdir(parents=True, exist_ok=True)
    vllm = _write(directory / "vllm", python, _module("llmgw.testing.vllm_standin"))
    ray = _write(directory / "ray", python, _module("llmgw.testing.ray_standin"))
    wrapper = _write(
        directory / "python",
        python,
        "import os, runpy, sys\n"
        "if sys.argv[1:3] == ['-m', 'sglang.launch_server']:\n"
        "    sys.argv = [sys.argv[0], *sys.argv[3:]]\n"
        "    runpy.run_module('llmgw.testing.sglang_standin', run_name='__main__', alter_sys=True)\n"
        "else:\n"
        f"    os.execv({python!r}, [{python!r}, *sys.argv[1:]])",
    )
    trtllm = _write(directory / "trtllm-serve", python, _module("llmgw.testing.trtllm_standin"))
    (directory / "comfyui").mkdir(exist_ok=True)
    comfyui_main = _write(directory / "comfyui" / "main.py", python, _module("llmgw.testing.comfyui_standin"))
    return StandinPrograms(vllm=vllm, python=wrapper, trtllm_serve=trtllm, comfyui_main=comfyui_main, ray=ray)
