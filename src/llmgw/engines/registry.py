"""Engines by the name a profile gives them: one object per row of :data:`llmgw.core.engines.ENGINES`."""

from __future__ import annotations

from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.engines import comfyui, llamacpp, sglang, trtllm, vllm
from llmgw.engines.engine import Engine
from llmgw.errors import ConfigError

ENGINES: dict[str, Engine] = {
    llamacpp.NAME: llamacpp.ENGINE,
    vllm.NAME: vllm.ENGINE,
    sglang.NAME: sglang.ENGINE,
    trtllm.NAME: trtllm.ENGINE,
    comfyui.NAME: comfyui.ENGINE,
}


def engine_named(name: str) -> Engine:
    """The engine a profile names (empty: the default engine); ConfigError for an unknown one."""
    engine = ENGINES.get(name or DEFAULT_ENGINE)
    if engine is None:
        raise ConfigError(f"unknown engine {name!r}", hint=f"use one of {', '.join(ENGINES)}")
    return engine
