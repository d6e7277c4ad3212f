"""C4.5 on the node: a profile's args and env are checked again before an engine starts."""

from __future__ import annotations

import pytest

from llmgw.agent.supervising import check_refusals
from llmgw.core.shards import ShardSpec
from llmgw.errors import LlmgwError


def test_the_node_refuses_what_the_catalog_would_have_refused() -> None:
    spec = ShardSpec(
        replica_id="r1",
        model="m",
        engine="vllm",
        args=("--dtype", "half", "--trust-remote-code"),
        env={"NCCL_NET_PLUGIN": "x"},
    )
    with pytest.raises(LlmgwError) as caught:
        check_refusals(spec)
    message = str(caught.value)
    assert "--trust-remote-code" in message and "NCCL_NET_PLUGIN" in message
    assert "fix the model's profile" in message


def test_llama_arg_variables_are_flags_on_the_node_too() -> None:
    with pytest.raises(LlmgwError, match="--slot-save-path"):
        check_refusals(
            ShardSpec("r1", model="m", engine="llama.cpp", env={"LLAMA_ARG_SLOT_SAVE_PATH": "/tmp"})
        )


def test_a_clean_profile_passes() -> None:
    check_refusals(ShardSpec("r1", model="m", engine="sglang", args=("--mem-fraction-static", "0.8")))
