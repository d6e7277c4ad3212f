"""The collector's settings for a server process: thresholds, their override, and settling."""

from __future__ import annotations

import gc

import pytest

from llmgw.errors import ConfigError
from llmgw.runtime import collector


def test_the_thresholds_are_raised_above_cpythons_unless_overridden() -> None:
    assert collector.thresholds({}) == collector.THRESHOLDS
    assert collector.THRESHOLDS[0] > 700
    assert collector.thresholds({collector.ENVIRONMENT: " 700, 10,10 "}) == (700, 10, 10)


@pytest.mark.parametrize("text", ["700,10", "a,b,c", "700,0,10", "-1,10,10", "1,2,3,4"])
def test_a_malformed_override_says_what_is_wrong_and_what_to_set(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        collector.thresholds({collector.ENVIRONMENT: text})
    assert collector.ENVIRONMENT in str(raised.value)
    assert "700,10,10" in str(raised.value)


def test_settle_freezes_what_is_held_and_sets_the_thresholds() -> None:
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    kept = [[n] for n in range(10)]  # lists: objects the collector tracks
    try:
        chosen = collector.settle({collector.ENVIRONMENT: "30000,15,50"})
        assert chosen == (30000, 15, 50)
        assert gc.get_threshold() == (30000, 15, 50)
        assert gc.get_freeze_count() >= frozen + len(kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
