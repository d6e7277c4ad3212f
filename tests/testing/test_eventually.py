"""eventually: the one poll loop of the test kit."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.testing.eventually import eventually, eventually_sync


class Countdown:
    """A condition that turns true on its ``turns``-th call, returning ``value`` then."""

    def __init__(self, turns: int, value: object = "ready") -> None:
        self.left = turns
        self.value = value
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        self.left -= 1
        return self.value if self.left <= 0 else None


async def test_returns_the_truthy_value_of_a_sync_condition() -> None:
    condition = Countdown(3, {"replica": "r1"})

    assert await eventually(condition, interval_s=0) == {"replica": "r1"}
    assert condition.calls == 3


async def test_awaits_an_async_condition() -> None:
    condition = Countdown(2)

    async def ready() -> object:
        await asyncio.sleep(0)
        return condition()

    assert await eventually(ready, interval_s=0) == "ready"


async def test_sees_what_another_task_makes_true() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_soon(done.set)

    assert await eventually(done.is_set) is True


async def test_timeout_names_what_was_awaited_and_the_last_value() -> None:
    with pytest.raises(AssertionError) as caught:
        await eventually(lambda: [], timeout_s=0.05, message="the replica list fills")

    text = str(caught.value)
    assert "waited 0.05 s for the replica list fills" in text
    assert "last value: []" in text


async def test_an_assertion_in_the_condition_means_not_yet_and_is_reported() -> None:
    def checked() -> None:
        assert 1 + 1 == 3, "arithmetic moved"

    with pytest.raises(AssertionError) as caught:
        await eventually(checked, timeout_s=0.05)

    assert "last error: AssertionError: arithmetic moved" in str(caught.value)
    assert isinstance(caught.value.__cause__, AssertionError)
    assert "checked() to turn true" in str(caught.value)


async def test_an_exception_not_ignored_propagates_at_once() -> None:
    condition = Countdown(100)

    def failing() -> object:
        condition()
        raise KeyError("r1")

    with pytest.raises(KeyError):
        await eventually(failing, timeout_s=5, ignoring=(OSError,))
    assert condition.calls == 1


def test_the_sync_variant_returns_the_value_and_times_out_the_same_way() -> None:
    assert eventually_sync(Countdown(2, 7), interval_s=0) == 7

    with pytest.raises(AssertionError, match=r"waited 0.05 s for cp2 leads, in vain .*; last value: False"):
        eventually_sync(lambda: False, timeout_s=0.05, message="cp2 leads")
