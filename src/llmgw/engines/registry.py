"""Engines by the name a profile gives them."""

from __future__ import annotations

from llmgw.engines import llamacpp, sglang, trtllm, vllm
from llmgw.engines.engine import Engine
from llmgw.errors import ConfigError

ENGINES: dict[str, Engine] = {
    llamacpp.NAME: llamacpp.ENGINE,
    vllm.NAME: vllm.ENGINE,
    sglang.NAME: sglang.ENGINE,
    trtllm.NAME: trtllm.ENGINE,
}


def engine_named(name: str) -> Engine:
    """The engine a profile names (empty: llama.cpp); ConfigError for an unknown one."""
    engine = ENGINES.get(name or llamacpp.NAME)
    if engine is None:
        raise ConfigError(f"unknown engine {name!r}", hint=f"use one of {', '.join(ENGINES)}")
    return engine
