"""Copies: how many control planes should hold a blob, where to pull one from, and pulling it.

A blob is acknowledged once ``wanted`` control planes hold it: ``mirror.copies``
in server.yaml, or, left at 0, every control plane with at most two
(:func:`wanted_copies`). A plane lacking a blob pulls it from a peer that
holds it, the leader first (:func:`pull_order`), through a
:class:`~llmgw.mirror.fetching.BlobWriter`, so the bytes are checked against
their sha256 and a pull cut short resumes where it stopped (:func:`pull`).
The transport is the caller's: a :data:`PeerFetch` gives a blob's bytes from
one address.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from llmgw.errors import ChannelClosed, ChecksumMismatch, DownloadError, NotFound, Unauthorized
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.fetching import BlobWriter

log = logging.getLogger(__name__)

DEFAULT_MOST = 2
"""With ``mirror.copies`` at 0, a blob is acknowledged once every control plane holds it, or two of them."""

PeerFetch = Callable[[str, str, int], AsyncIterator[bytes]]
"""A blob's bytes from the control plane at ``address``, for ``(address, sha256, offset)``."""

Progress = Callable[[int, int], None]
"""Called with (bytes held, bytes in all) as a pull goes on."""


def wanted_copies(setting: int, planes: int) -> int:
    """The copies a blob should have: ``setting`` when set, else every plane, at most two (at least 1)."""
    if setting > 0:
        return setting
    return max(1, min(planes, DEFAULT_MOST))


@dataclass(frozen=True)
class Holder:
    """A control plane holding a blob: its name and where it is reached."""

    plane: str
    address: str


def pull_order(holders: Iterable[Holder], leader: str, live: Iterable[str], me: str = "") -> list[str]:
    """The addresses to pull from, best first: the leader, then the other live planes in the order
    given; planes not live (not seen lately) and this plane itself are left out."""
    alive = set(live)
    chosen = [h for h in holders if h.plane in alive and h.plane != me and h.address]
    chosen.sort(key=lambda h: h.plane != leader)  # stable: the leader first, the rest as they came
    return list(dict.fromkeys(h.address for h in chosen))


@dataclass(frozen=True)
class Acknowledgement:
    """How many copies a blob had when its import answered, of how many wanted, and what follows."""

    copies: tuple[str, ...]
    """The planes holding it."""
    wanted: int
    note: str


def acknowledgement(copies: Sequence[str], wanted: int, pulling: Sequence[str]) -> Acknowledgement:
    """What an import answers: all wanted copies held, or why not yet and what happens next.

    ``pulling``: the live peers that do not hold it yet (they pull it in the background).
    """
    held = tuple(copies)
    planes = "control plane" if len(held) == 1 else "control planes"
    if len(held) >= wanted:
        return Acknowledgement(held, wanted, f"held by {len(held)} {planes} ({', '.join(held)})")
    counted = f"{len(held)} {'copy' if len(held) == 1 else 'copies'} of {wanted} wanted"
    if not pulling:
        note = (
            f"acknowledged with {counted}: no other control plane is live yet; "
            "peers will pull it when they start ('llmgw mirror list' shows the copies)"
        )
    else:
        note = (
            f"acknowledged with {counted}: {', '.join(pulling)} still pulling it; "
            "'llmgw mirror list' shows when they hold it"
        )
    return Acknowledgement(held, wanted, note)


async def pull(
    blobs: BlobStore,
    sha256: str,
    size: int,
    places: Sequence[str],
    fetch: PeerFetch,
    progress: Progress | None = None,
) -> str:
    """Fetch a blob into ``blobs`` from the first of ``places`` that gives it whole; the address it
    came from.

    A place that lacks it, refuses it, breaks off or sends bytes that do not hash to ``sha256`` is
    passed over for the next; what a broken-off place sent is kept, and the next place (or the next
    pull) sends only the rest. None giving it: :class:`DownloadError` naming each one's reason.
    """
    if not places:
        raise NotFound(
            f"no other control plane holds blob sha256:{sha256} yet",
            hint="import it again on a control plane that runs, or wait for the one that holds it",
        )
    dest = blobs.path_for(sha256)
    reasons: list[str] = []
    for place in places:
        writer = BlobWriter(dest, sha256, size)
        offset = await writer.start()
        try:
            async for chunk in fetch(place, sha256, offset):
                await writer.write(chunk)
                if progress is not None:
                    progress(writer.offset, size)
            await writer.finish()
        except ChecksumMismatch as error:
            reasons.append(f"{place}: {error.message}")  # the partial went with it: the next starts at 0
            continue
        except (NotFound, Unauthorized, ChannelClosed, DownloadError) as error:
            await writer.close()
            reasons.append(f"{place}: {error.message}")
            continue
        await asyncio.to_thread(dest.chmod, 0o444)
        return place
    raise DownloadError(
        f"could not pull blob sha256:{sha256[:12]}… from any peer: {'; '.join(reasons)}",
        hint="the next pass tries again from where this one stopped; 'llmgw mirror list' shows who holds it",
    )
