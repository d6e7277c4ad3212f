"""Who calls ``/api``: the first admin token, or a user's token, known in memory by its sha256.

The token ``server init`` wrote is the first cluster admin (``admin`` in the
audit log). A user's token acts with the user's role bindings
(:mod:`llmgw.core.tenancy`). :class:`Callers` holds the live tokens' hashes
and the users' bindings, read from the store at start, on leading, after
every change through ``/api`` and every :data:`RELOAD_S` seconds (so a
standby learns tokens made on the leader); it answers each request from
memory, with a token's expiry checked against the clock then.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.tenancy import (
    CLUSTER,
    NOWHERE,
    Action,
    Binding,
    Owner,
    Permission,
    Place,
    Role,
    may_as,
    role_over,
    user_place,
    visible,
)
from llmgw.errors import Forbidden, LlmgwError
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.database import Store

log = logging.getLogger(__name__)

RELOAD_S = 10.0
"""Seconds between reloads of the tokens and bindings from the store."""

ADMIN = "admin"
"""The audit log's name for the first admin token."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from, with what they may do and see."""

    name: str
    """The user's name, or ``admin`` for the first admin token."""
    bindings: tuple[Binding, ...]
    place: Place = NOWHERE

    def may(self, action: Action, owner: Owner) -> Permission:
        return may_as(self.name if self.name != ADMIN else "", self.bindings, action, owner)

    def check(self, action: Action, owner: Owner) -> None:
        """Raise :class:`~llmgw.errors.Forbidden` (403, saying the role needed) unless allowed."""
        permission = self.may(action, owner)
        if not permission:
            raise Forbidden(
                f"{self.name} may not {action.value} {owner or 'the cluster'}: {permission.reason}",
                "ask an administrator of it for a role there ('llmgw ctl user role …')",
            )

    def sees(self, owner: Owner) -> bool:
        """Whether the caller sees what ``owner`` owns: visible from the caller's place, or by role."""
        return visible(owner, self.place) or bool(self.may(Action.READ, owner))

    def highest(self) -> Role | None:
        """The caller's highest role anywhere (None: none bound)."""
        return max((b.role for b in self.bindings), default=None)

    def role_over(self, owner: Owner) -> Role | None:
        return role_over(self.bindings, owner)


ADMIN_CALLER = Caller(ADMIN, (Binding(Role.CLUSTER_ADMIN, CLUSTER),))


@dataclass(frozen=True, slots=True)
class LiveToken:
    user: str
    expires_s: float | None
    """Unix time the token stops working (None: never)."""


def bearer(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ("" when there is none)."""
    return authorization[len("Bearer ") :].strip() if authorization.startswith("Bearer ") else ""


class Callers:
    """The admin token and users' live tokens, by sha256, with each user's bindings."""

    def __init__(self, admin_sha256: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self._admin_sha256 = admin_sha256
        self._clock = clock
        self._tokens: dict[str, LiveToken] = {}
        self._users: dict[str, Caller] = {}

    def replace(self, tokens: Mapping[str, LiveToken], bindings: Mapping[str, Sequence[Binding]]) -> None:
        """Make these the live tokens (by sha256) and every user's bindings."""
        users = {user: Caller(user, tuple(b), user_place(user, b)) for user, b in bindings.items()}
        self._tokens, self._users = dict(tokens), users

    def identify(self, authorization: str) -> Caller | None:
        """The caller an ``Authorization`` header names; None for no token or one not live."""
        token = bearer(authorization)
        if not token:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        if hmac.compare_digest(digest, self._admin_sha256):
            return ADMIN_CALLER
        live = self._tokens.get(digest)
        if live is None or (live.expires_s is not None and self._clock.time() >= live.expires_s):
            return None
        return self._users.get(live.user) or Caller(live.user, (), user_place(live.user, ()))

    async def load(self, store: Store) -> None:
        """Read the live tokens and every binding from the store."""
        tokens = await store.tokens.live()
        bindings = await store.users.bindings()
        self.replace(
            {
                t.secret_hash: LiveToken(t.user, None if t.expires_at is None else t.expires_at.timestamp())
                for t in tokens
            },
            bindings,
        )

    async def keep_loaded(self, store: Store, interval_s: float = RELOAD_S) -> None:
        """Reload every ``interval_s`` for ever (a supervised component); a store out of reach is logged."""
        while True:
            try:
                await self.load(store)
            except LlmgwError as error:
                log.warning("could not reload the users' tokens: %s", error)
            await self._clock.sleep(interval_s)
