"""Copies: how many are wanted, where a plane pulls from, and pulling a blob from peers."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.errors import ChannelClosed, DownloadError, NotFound
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.copies import Holder, acknowledgement, pull, pull_order, wanted_copies

CONTENT = bytes(range(256)) * 8192
SHA = hashlib.sha256(CONTENT).hexdigest()
CHUNK = 65536


@dataclass
class Peers:
    """Peers by address: the bytes each gives, and where each breaks off (None: never)."""

    content: dict[str, bytes]
    breaks_at: dict[str, int] = field(default_factory=dict)
    asked: list[tuple[str, int]] = field(default_factory=list)

    async def __call__(self, address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
        self.asked.append((address, offset))
        if address not in self.content:
            raise NotFound(f"{address} has no blob {sha256}", "import it")
        data = self.content[address]
        stop = self.breaks_at.get(address, len(data))
        for start in range(offset, stop, CHUNK):
            yield data[start : min(start + CHUNK, stop)]
        if stop < len(data):
            raise ChannelClosed(f"the stream with {address} ended", "retrying")


@pytest.mark.parametrize(
    ("setting", "planes", "wanted"), [(0, 1, 1), (0, 2, 2), (0, 5, 2), (3, 5, 3), (3, 1, 3), (0, 0, 1)]
)
def test_copies_wanted_are_every_plane_at_most_two_unless_set(setting: int, planes: int, wanted: int) -> None:
    assert wanted_copies(setting, planes) == wanted


def test_the_leader_comes_first_and_planes_not_live_are_left_out() -> None:
    holders = [Holder("cp1", "a:1"), Holder("cp2", "b:1"), Holder("cp3", "c:1"), Holder("cp4", "d:1")]
    assert pull_order(holders, leader="cp3", live={"cp1", "cp3", "cp4"}, me="cp4") == ["c:1", "a:1"]


def test_an_import_with_no_live_peer_says_peers_will_pull_it() -> None:
    answer = acknowledgement(["cp1"], 2, [])
    assert (answer.copies, answer.wanted) == (("cp1",), 2)
    assert "1 copy of 2 wanted" in answer.note and "peers will pull it" in answer.note


def test_an_import_held_by_every_wanted_plane_says_so() -> None:
    assert acknowledgement(["cp1", "cp2"], 2, ["cp2"]).note == "held by 2 control planes (cp1, cp2)"


async def test_a_pulled_blob_lands_checked_and_read_only(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    peers = Peers({"b:1": CONTENT})
    seen: list[int] = []
    assert (
        await pull(blobs, SHA, len(CONTENT), ["b:1"], peers, lambda done, total: seen.append(done)) == "b:1"
    )
    assert blobs.path_for(SHA).read_bytes() == CONTENT and blobs.verify(SHA)
    assert blobs.path_for(SHA).stat().st_mode & 0o777 == 0o444
    assert seen[-1] == len(CONTENT)


async def test_a_peer_lacking_the_blob_is_passed_over_for_the_next(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    peers = Peers({"c:1": CONTENT})
    assert await pull(blobs, SHA, len(CONTENT), ["b:1", "c:1"], peers) == "c:1"
    assert peers.asked == [("b:1", 0), ("c:1", 0)]


async def test_a_pull_broken_off_resumes_where_it_stopped(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    peers = Peers({"b:1": CONTENT}, breaks_at={"b:1": 3 * CHUNK})
    with pytest.raises(DownloadError, match="b:1: the stream with b:1 ended"):
        await pull(blobs, SHA, len(CONTENT), ["b:1"], peers)
    assert not blobs.has(SHA)
    peers.breaks_at.clear()
    await pull(blobs, SHA, len(CONTENT), ["b:1"], peers)
    assert peers.asked == [("b:1", 0), ("b:1", 3 * CHUNK)]
    assert blobs.verify(SHA)


async def test_bytes_that_do_not_hash_to_the_blob_are_thrown_away_and_the_next_peer_asked(
    tmp_path: Path,
) -> None:
    blobs = BlobStore(tmp_path)
    damaged = bytes(reversed(CONTENT))
    peers = Peers({"b:1": damaged, "c:1": CONTENT})
    assert await pull(blobs, SHA, len(CONTENT), ["b:1", "c:1"], peers) == "c:1"
    assert peers.asked == [("b:1", 0), ("c:1", 0)]
    assert blobs.verify(SHA)


async def test_with_no_peer_holding_it_nothing_is_asked(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no other control plane holds"):
        await pull(BlobStore(tmp_path), SHA, len(CONTENT), [], Peers({}))
