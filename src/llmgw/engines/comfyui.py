"""ComfyUI as an engine: the agent starts llmgw's gate, which starts ComfyUI.

The replica's command line is ``llmgw comfyui-gate`` (run by the agent's own
Python, :mod:`llmgw.engines.comfyui_gate`) with the replica's port and host,
its key file, a base directory of its own beside the key file, the
operator's ComfyUI (``engines.comfyui.python`` and ``.main`` in agent.yaml)
and every fetched weights file under its own name. A profile's ``args`` go
on to ComfyUI itself (after ``--``), so ``--cpu`` or ``--lowvram`` may be
given there; the flags the gate sets for ComfyUI may not.

Health is the gate's ``/health`` (200 once ComfyUI answers and the gate's
websocket to it is open). Metrics are the gate's minimal ``/metrics``: two
gauges from ComfyUI's queue, ``comfyui_queue_running`` and
``comfyui_queue_pending``, read as running and waiting requests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmgw.core.engines import COMFYUI
from llmgw.engines.engine import Compute, Launch, MetricNames, cuda_devices, key_arguments
from llmgw.errors import ConfigError

CAPABILITIES = COMFYUI
NAME = CAPABILITIES.name
GATE = ("-m", "llmgw.cli.main", "comfyui-gate")
BASE_DIR = "comfyui"
"""The replica's ComfyUI base directory, in the shard's directory (beside its key file)."""


def weights_arguments(weights: Path) -> list[str]:
    """``--weights NAME=PATH`` for the weights file, or for every file of the weights folder."""
    if not weights.is_dir():
        return ["--weights", f"{weights.name}={weights}"]
    found = []
    for root, _, files in os.walk(weights, followlinks=True):
        for name in sorted(files):
            path = Path(root) / name
            found += ["--weights", f"{path.relative_to(weights).as_posix()}={path}"]
    return found


def hf_repository_arguments(launch: Launch) -> list[str]:
    """``--hf-repo ORG/NAME=FOLDER``: the model's fetched folder as its repository's cached snapshot,
    so a node loading it by name finds it offline (none for one weights file)."""
    if not launch.comfyui_hf_repository or not launch.weights.is_dir():
        return []
    return ["--hf-repo", f"{launch.comfyui_hf_repository}={launch.weights}"]


class ComfyuiEngine:
    capabilities = CAPABILITIES
    name = NAME
    health_path = CAPABILITIES.health_path
    metrics_path = CAPABILITIES.metrics_path
    metrics = MetricNames(running=("comfyui_queue_running",), waiting=("comfyui_queue_pending",))

    def __init__(self, gate_python: str = sys.executable) -> None:
        self.gate_python = gate_python

    def command_line(self, program: Path, launch: Launch) -> list[str]:
        """The gate for one replica; ``program`` is ComfyUI's Python, ``launch.entry`` its main.py."""
        launch.checked(NAME)
        key = key_arguments(CAPABILITIES, launch)
        if launch.entry is None:
            raise ConfigError(
                "ComfyUI's main.py was not given",
                hint="set engines.comfyui.main in agent.yaml to ComfyUI's main.py",
            )
        return [
            self.gate_python, *GATE,
            "--host", launch.host,
            "--port", str(launch.port),
            *key,
            "--base-dir", str(Path(key[1]).parent / BASE_DIR),
            "--comfyui-python", str(program),
            "--comfyui-main", str(launch.entry),
            "--model", launch.model,
            *weights_arguments(launch.weights),
            *(argument for node in launch.comfyui_nodes for argument in ("--custom-node", node)),
            *hf_repository_arguments(launch),
            "--",
            *launch.args,
        ]  # fmt: skip

    def default_environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def environment(self, launch: Launch) -> dict[str, str]:
        return {}

    def parse_compute(self, log_text: str, launch: Launch) -> Compute:
        return cuda_devices(launch)


ENGINE = ComfyuiEngine()
