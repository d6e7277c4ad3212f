"""The planes' shares of every limit: even without use, by use with a floor, summing to one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.limitshares import FLOOR, PlaneShares, divide


def test_subjects_no_plane_used_are_split_evenly() -> None:
    shares = divide(["cp2", "cp1", "cp3"], {})
    assert shares.planes == ("cp1", "cp2", "cp3")
    assert shares.of("cp2") == (pytest.approx(1 / 3), {})


def test_a_plane_alone_holds_every_limit_whole() -> None:
    assert divide(["cp1"], {"cp1": {"key:a": 50.0}}).of("cp1") == (1.0, {})


def test_a_subject_used_through_one_plane_goes_mostly_to_it_and_the_other_keeps_its_floor() -> None:
    shares = divide(["cp1", "cp2"], {"cp1": {"key:a": 90.0}, "cp2": {"key:b": 10.0}})
    default, mine = shares.of("cp1")
    assert default == 0.5
    assert mine["key:a"] == pytest.approx(FLOOR / 2 + (1 - FLOOR))
    assert mine["key:b"] == pytest.approx(FLOOR / 2)
    assert shares.of("cp2")[1]["key:a"] == pytest.approx(FLOOR / 2)


def test_a_plane_not_yet_divided_for_holds_what_one_more_plane_would() -> None:
    assert divide(["cp1", "cp2"], {}).of("cp3") == (pytest.approx(1 / 3), {})


@given(
    st.dictionaries(
        st.sampled_from(["cp1", "cp2", "cp3"]),
        st.dictionaries(st.sampled_from(["key:a", "key:b", "org:x"]), st.floats(0, 1e6)),
    )
)
def test_every_subjects_shares_sum_to_one(use: dict[str, dict[str, float]]) -> None:
    shares = divide(["cp1", "cp2", "cp3"], use)
    for subject in ("key:a", "key:b", "org:x", "key:unused"):
        total = 0.0
        for plane in shares.planes:
            default, by = shares.of(plane)
            total += by.get(subject, default)
        assert total == pytest.approx(1.0)


def test_a_vanishingly_small_use_still_divides_to_one() -> None:
    shares = divide(["cp1", "cp2", "cp3"], {"cp1": {"key:a": 5e-324}})
    assert sum(shares.of(plane)[1]["key:a"] for plane in shares.planes) == pytest.approx(1.0)


def test_planes_both_refused_converge_on_an_even_split() -> None:
    """Each plane admits exactly its share (both want more): the division moves to even."""
    use = {"cp1": {"key:a": 0.95}, "cp2": {"key:a": 0.05}}
    for _ in range(40):
        shares = divide(["cp1", "cp2"], use)
        use = {plane: {"key:a": shares.of(plane)[1]["key:a"]} for plane in shares.planes}
    assert use["cp1"]["key:a"] == pytest.approx(0.5, abs=0.01)


def test_a_division_round_trips_and_small_moves_are_not_sent_again() -> None:
    shares = divide(["cp1", "cp2"], {"cp1": {"key:a": 70.0}, "cp2": {"key:a": 30.0}})
    assert PlaneShares.from_dict(shares.as_dict()) == shares
    nearby = divide(["cp1", "cp2"], {"cp1": {"key:a": 71.0}, "cp2": {"key:a": 29.0}})
    assert nearby.close_to(shares)
    assert not divide(["cp1", "cp2"], {"cp1": {"key:a": 99.0}}).close_to(shares)
    assert not divide(["cp1", "cp2", "cp3"], {}).close_to(divide(["cp1", "cp2"], {}))
