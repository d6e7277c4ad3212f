"""Blob sources: where a node fetches a mirrored file from, best first.

Every control plane keeps a copy of the mirror (``docs/mirror.md``). The agent
knows every control plane's agent address: those of agent.yaml and those each
registration names (:class:`~llmgw.agent.session.AgentSession`). A blob is
asked of the leader first (the plane the agent's stream reached last: a
standby points it on to the leader), then of the others in the order known.
A place that lacks the blob, refuses it or cannot be reached before its first
byte is passed over for the next; one that breaks off mid-way ends the fetch
with :class:`~llmgw.errors.ChannelClosed`, and the installer's next try
resumes from what it kept (from the first place again)::

    sources = BlobSources(leader=lambda: links.current, known=lambda: session.control_planes, fetch_from=...)
    installer = Installer(config, inventory, sources.fetcher, traces)
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence

from llmgw.errors import ChannelClosed, LlmgwError, NotFound, Unauthorized

log = logging.getLogger(__name__)

Fetch = Callable[[str, int], AsyncIterator[bytes]]
"""A blob's bytes for ``(sha256, offset)``: what the installer takes."""

PlaceFetch = Callable[[str, str, int], AsyncIterator[bytes]]
"""A blob's bytes from the control plane at ``address``, for ``(address, sha256, offset)``."""


class BlobSources:
    """The control planes to fetch from, the leader first, and a fetch that goes down that list."""

    def __init__(
        self, leader: Callable[[], str], known: Callable[[], Sequence[str]], fetch_from: PlaceFetch
    ) -> None:
        self._leader = leader
        self._known = known
        self._fetch_from = fetch_from

    def places(self) -> list[str]:
        """Every control plane's agent address, the leader's first, each once."""
        return list(dict.fromkeys(p for p in (self._leader(), *self._known()) if p))

    def fetcher(self) -> Fetch:
        """A fetch over :meth:`places` as they are now."""
        places = self.places()
        fetch_from = self._fetch_from

        async def fetch(sha256: str, offset: int) -> AsyncIterator[bytes]:
            reasons: list[LlmgwError] = []
            for place in places:
                started = False
                try:
                    async for chunk in fetch_from(place, sha256, offset):
                        started = True
                        yield chunk
                    return
                except (NotFound, Unauthorized, ChannelClosed) as error:
                    if started:
                        raise
                    log.info(
                        "%s cannot give blob %s…: %s; asking the next", place, sha256[:12], error.message
                    )
                    reasons.append(error)
            raise _none_gave(sha256, places, reasons)

        return fetch


def _none_gave(sha256: str, places: Sequence[str], reasons: Sequence[LlmgwError]) -> LlmgwError:
    """NotFound when every place answered without it; ChannelClosed (worth another try) when one
    could not be reached."""
    said = "; ".join(f"{place}: {error.message}" for place, error in zip(places, reasons, strict=False))
    if not places:
        return NotFound(
            f"no control plane to fetch blob {sha256[:12]}… from",
            "list the control planes' agent addresses under control_planes in agent.yaml",
        )
    if any(isinstance(error, ChannelClosed) for error in reasons):
        return ChannelClosed(f"no control plane gave blob {sha256[:12]}…: {said}", "retrying")
    return NotFound(
        f"no control plane holds blob {sha256[:12]}… for this node: {said}",
        "import the file into the mirror ('llmgw mirror import FILE'); 'llmgw mirror list' shows its copies",
    )
