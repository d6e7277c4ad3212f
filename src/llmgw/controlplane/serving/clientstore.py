"""The store as what clients make is kept: conversations, jobs, files, batches.

Every process that answers clients (the leader, a standby, a gateway worker)
opens the store a second time for what its clients make, without the lease's
fence, so that whichever of them a client's next request reaches finds what
the first made, also right after a failover.
"""

from __future__ import annotations

import contextlib

from llmgw.controlplane.config import ServerConfig
from llmgw.store.database import Store


async def open_client_store(config: ServerConfig, closing: contextlib.AsyncExitStack) -> Store:
    """The store as every process that answers clients writes what they make: no fence.

    The lease fences the cluster's desired state (catalog, replicas, settings), which only the
    leader writes. What a client made is written by whichever process answered it, leader, standby
    or gateway worker, so that any of them answers the client's next request; two planes that both
    think they lead write different rows there, never the same one. Its own pool, closed by
    ``closing``."""
    clients = await Store.open(config.store_url, timeout_s=config.store.timeout_s)
    closing.push_async_callback(clients.close)
    return clients
