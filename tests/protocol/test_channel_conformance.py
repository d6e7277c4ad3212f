"""Every channel implementation (in memory, gRPC with mutual TLS, a Unix socket) keeps the contract of
channels.py."""

from __future__ import annotations

import pytest

from llmgw.testing.channel_conformance import CHECKS, Check, PairFactory, run_check


@pytest.mark.parametrize("check", CHECKS, ids=str)
async def test_the_channel_keeps_the_contract(check: Check, channel_pairs: PairFactory) -> None:
    await run_check(check, channel_pairs)
