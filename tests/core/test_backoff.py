"""Backoff: delays that grow, stop at a cap, and start again after a success."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.backoff import Backoff


def delays(backoff: Backoff, count: int) -> list[float]:
    return [backoff.next_delay() for _ in range(count)]


def test_the_first_delay_is_the_base() -> None:
    assert Backoff(base=0.5).next_delay() == 0.5


def test_each_delay_grows_by_the_factor() -> None:
    assert delays(Backoff(base=1.0, factor=3.0, cap=1000.0), 4) == [1.0, 3.0, 9.0, 27.0]


def test_delays_stop_growing_at_the_cap() -> None:
    assert delays(Backoff(base=1.0, factor=2.0, cap=5.0), 6) == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_reset_starts_again_from_the_base() -> None:
    backoff = Backoff(base=1.0, factor=2.0, cap=60.0)
    delays(backoff, 5)

    backoff.reset()

    assert delays(backoff, 2) == [1.0, 2.0]


def test_the_defaults_start_at_one_second_and_stop_at_a_minute() -> None:
    assert delays(Backoff(), 8) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


@given(
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=1.0, max_value=10.0),
    st.floats(min_value=0.01, max_value=600.0),
    st.integers(min_value=1, max_value=200),
)
def test_delays_never_shrink_nor_pass_the_cap(base: float, factor: float, cap: float, count: int) -> None:
    found = delays(Backoff(base=base, factor=factor, cap=cap), count)

    assert found == sorted(found)
    assert max(found) <= cap


@given(
    draws=st.lists(st.floats(min_value=0.0, max_value=0.999), min_size=1, max_size=12),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_jitter_shortens_each_delay_by_at_most_its_fraction(draws: list[float], jitter: float) -> None:
    plain = delays(Backoff(base=0.5, factor=1.5, cap=2.0), len(draws))
    drawn = iter(draws)
    jittered = delays(
        Backoff(base=0.5, factor=1.5, cap=2.0, jitter=jitter, draw=lambda: next(drawn)), len(draws)
    )
    for full, short, draw in zip(plain, jittered, draws, strict=True):
        assert short == full * (1.0 - jitter * draw)
        assert full * (1.0 - jitter) <= short <= full


def test_two_clients_drawing_differently_try_again_at_different_times() -> None:
    early, late = (
        Backoff(base=1.0, jitter=0.5, draw=lambda: 0.9),
        Backoff(base=1.0, jitter=0.5, draw=lambda: 0.1),
    )
    assert early.next_delay() == 0.55
    assert late.next_delay() == 0.95
