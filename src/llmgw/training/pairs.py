"""Question/answer pairs taken from knowledge collections, and who may train on them.

The knowledge side implements :class:`CollectionPairs`; until one is wired,
a job naming collections is refused with :data:`NOT_AVAILABLE`. Pairs from a
collection carry its owner: the job's owner defaults to the one owner its
collections have, the submitter must be able to read every collection, and
such pairs never become a public (cluster-owned) adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from llmgw.core.tenancy import Owner
from llmgw.errors import NotFound, ValidationFailed

NOT_AVAILABLE = "knowledge collections are not available"
UNKNOWN_HINT = "name a collection you may read"


class CollectionPairs(Protocol):
    """Where a collection's question/answer pairs come from (the knowledge side)."""

    async def pairs(self, collection: str) -> tuple[Owner, list[tuple[str, str]]]:
        """The collection's owner and pairs; NotFound when there is no such collection."""
        ...


@dataclass(frozen=True)
class GatheredPairs:
    owner: Owner
    """The job's owner: the one given, else the one owner of the collections."""
    pairs: list[tuple[str, str]]


async def gather_pairs(
    source: CollectionPairs | None,
    collections: Sequence[str],
    may_read: Callable[[Owner], bool],
    owner: Owner | None,
) -> GatheredPairs:
    """Every pair of ``collections``, checked: readable by the submitter, owned by someone, not public.

    ``owner`` is the owner asked for (None: the collections' own, when they
    have one owner between them).
    """
    if source is None:
        raise ValidationFailed(
            [("pairs_from", NOT_AVAILABLE)], "upload the pairs as JSON lines instead (--pairs FILE)"
        )
    owners: list[Owner] = []
    pairs: list[tuple[str, str]] = []
    for name in collections:
        try:
            found_owner, found = await source.pairs(name)
        except NotFound as error:
            raise NotFound(error.message, error.hint or UNKNOWN_HINT) from None
        if not may_read(found_owner):
            raise NotFound(f"no knowledge collection {name!r}", UNKNOWN_HINT)
        owners.append(found_owner)
        pairs += found
    distinct = sorted(set(owners), key=str)
    if owner is None:
        if len(distinct) != 1:
            raise ValidationFailed(
                [("owner", f"the collections have {len(distinct)} owners ({', '.join(map(str, distinct))})")],
                "name the adapter's owner with --owner",
            )
        owner = distinct[0]
    if owner.public:
        raise ValidationFailed(
            [("owner", "pairs from a knowledge collection never become a public adapter")],
            "give an organization, team, project or user as the owner",
        )
    if not pairs:
        raise ValidationFailed(
            [("pairs_from", "the collections hold no question/answer pair")],
            "add pairs to the collections, or upload them with --pairs FILE",
        )
    return GatheredPairs(owner, pairs)
