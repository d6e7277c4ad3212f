"""Blob sources: a node fetches from the leader first, then from any other control plane holding the blob."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from llmgw.agent.blobsources import BlobSources
from llmgw.errors import ChannelClosed, NotFound, Unauthorized

SHA = "ab" * 32
DATA = b"0123456789" * 100


@dataclass
class Planes:
    """Control planes by address: what each holds, which refuse, which are down, which break off."""

    holding: set[str] = field(default_factory=set)
    refusing: set[str] = field(default_factory=set)
    down: set[str] = field(default_factory=set)
    breaking: set[str] = field(default_factory=set)
    asked: list[tuple[str, int]] = field(default_factory=list)

    async def fetch_from(self, address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
        self.asked.append((address, offset))
        if address in self.down:
            raise ChannelClosed(f"cannot reach {address}", "retrying")
        if address in self.refusing:
            raise Unauthorized(f"{address} refused blob {sha256[:12]}", "place a replica")
        if address not in self.holding:
            raise NotFound(f"no blob {sha256} in the mirror at {address}", "import it")
        yield DATA[offset : offset + 100]
        if address in self.breaking:
            raise ChannelClosed(f"the stream with {address} ended", "retrying")
        yield DATA[offset + 100 :]


def sources(
    planes: Planes, leader: str = "cp2:1", known: tuple[str, ...] = ("cp1:1", "cp2:1", "cp3:1")
) -> BlobSources:
    return BlobSources(lambda: leader, lambda: known, planes.fetch_from)


async def fetched(source: BlobSources, offset: int = 0) -> bytes:
    return b"".join([chunk async for chunk in source.fetcher()(SHA, offset)])


def test_the_leader_comes_first_then_every_other_plane_once() -> None:
    assert sources(Planes()).places() == ["cp2:1", "cp1:1", "cp3:1"]
    assert sources(Planes(), leader="").places() == ["cp1:1", "cp2:1", "cp3:1"]


async def test_the_leader_holding_the_blob_is_the_only_one_asked() -> None:
    planes = Planes(holding={"cp1:1", "cp2:1"})
    assert await fetched(sources(planes)) == DATA
    assert planes.asked == [("cp2:1", 0)]


async def test_a_blob_the_leader_lacks_comes_from_a_plane_that_holds_it() -> None:
    planes = Planes(holding={"cp3:1"}, refusing={"cp1:1"})
    assert await fetched(sources(planes), offset=300) == DATA[300:]
    assert planes.asked == [("cp2:1", 300), ("cp1:1", 300), ("cp3:1", 300)]


async def test_a_plane_down_is_passed_over() -> None:
    planes = Planes(holding={"cp1:1"}, down={"cp2:1"})
    assert await fetched(sources(planes)) == DATA


async def test_a_place_breaking_off_midway_ends_the_fetch_for_a_resume() -> None:
    planes = Planes(holding={"cp2:1", "cp1:1"}, breaking={"cp2:1"})
    with pytest.raises(ChannelClosed, match="the stream with cp2:1 ended"):
        await fetched(sources(planes))
    assert planes.asked == [("cp2:1", 0)], "bytes came: the installer resumes, no other place is asked"


async def test_no_plane_holding_it_is_not_found_naming_each_answer() -> None:
    planes = Planes(refusing={"cp1:1"})
    with pytest.raises(
        NotFound, match=r"no control plane holds blob ababababab.*cp2:1: no blob.*cp1:1: cp1:1 refused"
    ):
        await fetched(sources(planes))


async def test_with_a_plane_unreachable_and_none_holding_it_another_try_is_worth_it() -> None:
    planes = Planes(down={"cp3:1"})
    with pytest.raises(ChannelClosed, match="no control plane gave blob"):
        await fetched(sources(planes))
