"""Whether this control plane holds the key the store's secrets are sealed with.

The first control plane that opens the store with a key stores a value
sealed with it (``store_secrets``, row ``key-check``); every later opening
opens that value first, so a plane given another key (one it made itself,
not the cluster's) refuses to start, before it seals or reads anything with
it, rather than failing on every replica or sealing keys the others cannot
open.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from llmgw.errors import ConfigError, StoreError
from llmgw.store.access import StoreAccess
from llmgw.store.secretbox import KEY_FILE, WRONG_KEY_HINT, SecretBox
from llmgw.store.tables import StoreSecretRow

CHECK = "key-check"
ROW = "store_secrets.value:key-check"
CHECK_TEXT = "the llmgw store key of this cluster"


class _Taken(Exception):
    """Another control plane stored the check value first."""


async def check_key(store: StoreAccess, box: SecretBox) -> None:
    """Store the check value sealed with ``box`` when there is none, else open it:
    :class:`~llmgw.errors.ConfigError` when it does not open (another key)."""
    for _ in range(2):
        try:
            async with store.session() as session:
                row = await session.get(StoreSecretRow, CHECK)
                if row is None:
                    session.add(StoreSecretRow(name=CHECK, value=box.seal(CHECK_TEXT, ROW)))
                    try:
                        await session.flush()
                    except IntegrityError:
                        raise _Taken from None
                    return
                stored = row.value
        except _Taken:
            continue
        try:
            if box.open(stored, ROW) == CHECK_TEXT:
                return
        except StoreError:
            pass
        raise ConfigError(
            f"this control plane's {KEY_FILE} is not the key the cluster's store is sealed with",
            WRONG_KEY_HINT,
        )
    raise StoreError(
        "the store's key check value could not be read or written", "start the control plane again"
    )
