"""Who may ask what: the key a request carries, the models it sees, the task a route asks.

Every route of ``/v1`` checks its request here before anything else happens
(forwarded requests in ``app.py``, pictures and jobs in ``workflow_routes.py``):

- :meth:`Access.authenticate`: the bearer key, in memory (401 ``invalid_api_key``; 400 for a
  request with more than one ``Authorization`` header);
- :meth:`Access.visible`: a model (a catalog entry, or an adapter registered
  alone) exists for the key only where it sees it (:mod:`llmgw.core.tenancy`);
  any other answers 404 as a name never defined (:func:`model_not_found`);
- :meth:`Access.check_task`: the model serves what the route asks (400
  ``model_not_supported`` naming what it serves); it gives the model's
  :class:`~llmgw.core.requestbounds.RequestBounds`, which the body is checked against.
"""

from __future__ import annotations

from llmgw.core.requestbounds import DEFAULT_BOUNDS, RequestBounds
from llmgw.core.tenancy import visible
from llmgw.gateway.adapters import Adapters
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.keys import KeyEntry, KeyRing
from llmgw.gateway.paths import TASK_OF_ROUTE

TWO_AUTHORIZATIONS = b"\x00more than one Authorization header"
"""What a request's headers give :meth:`Access.authenticate` when they hold more than one
``Authorization`` (``app.py``'s header loop): never a key (it is told apart by identity), answered 400
rather than one of the keys picked."""


def two_authorizations() -> ApiError:
    """400 for a request with more than one ``Authorization`` header."""
    return ApiError(
        400,
        "The request has more than one Authorization header; send one, 'Authorization: Bearer <key>'.",
        "duplicate_authorization",
    )


def model_not_found(model: str) -> ApiError:
    """404 for a model the key does not see (or that was never defined: they answer alike)."""
    return ApiError(
        404,
        f"The model '{model}' does not exist; GET /v1/models lists the models.",
        "model_not_found",
        "model",
    )


class Access:
    """Keys, the catalog and the adapters as a request's checks read them."""

    __slots__ = ("_adapters", "_catalog", "_keys")

    def __init__(self, keys: KeyRing, catalog: GatewayCatalog, adapters: Adapters) -> None:
        self._keys = keys
        self._catalog = catalog
        self._adapters = adapters

    def authenticate(self, authorization: bytes | None) -> KeyEntry:
        """The key of an ``Authorization: Bearer`` header's value; 401 for none or an unknown one, 400
        for :data:`TWO_AUTHORIZATIONS` (looked at only once no key matched: no cost to a valid one)."""
        if not authorization:
            raise ApiError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'; "
                "an administrator issues keys with `llmgw ctl key create NAME`.",
                "invalid_api_key",
            )
        scheme, _, secret = authorization.partition(b" ")
        secret = secret.strip()
        entry = self._keys.lookup(secret) if scheme.lower() == b"bearer" and secret else None
        if entry is None:
            if authorization is TWO_AUTHORIZATIONS:
                raise two_authorizations()
            raise ApiError(
                401,
                "Incorrect API key provided. Check the key sent as 'Authorization: Bearer <key>', "
                "or ask an administrator for a new one.",
                "invalid_api_key",
            )
        return entry

    def visible(self, model: str, key: KeyEntry) -> bool:
        """Whether ``model`` (a catalog entry, or an adapter the feed registered alone) exists for ``key``."""
        entry = self._catalog.get(model)
        if entry is not None:
            return entry.visible_to(key.place)
        adapter = self._adapters.get(model)
        return adapter is not None and visible(adapter.owner, key.place)

    def check_task(self, model: str, path: str) -> RequestBounds:
        """400 unless ``model`` serves what ``path`` asks (a chat model asked for embeddings, say);
        else what a request to it may ask (an adapter: its model's; unknown: the defaults)."""
        entry = self._catalog.get(model)
        if entry is None:
            adapter = self._adapters.get(model)
            entry = self._catalog.get(adapter.model) if adapter is not None else None
        wanted = TASK_OF_ROUTE[path]
        if entry is None:
            return DEFAULT_BOUNDS
        if entry.serves.covers(wanted):
            return entry.bounds
        raise ApiError(
            400,
            f"The model '{model}' serves {entry.serves} ({entry.serves.routes}), not {wanted} ({path}). "
            f"Ask a model that serves {wanted} (GET /v1/models shows what each serves), or have an "
            f"administrator define one with 'serves: {wanted}' in its profile.",
            "model_not_supported",
            "model",
        )
