"""Limits enforced on the request path, from memory: one dict lookup and a few float operations.

The control plane feeds the limits per subject (``key:ID``, project, team,
organization, user) and the keys; :class:`Limiter` keeps one
:class:`~llmgw.core.limits.Meter` per limited subject and, per key, the tuple
of meters its requests count against (the key, then its place's chain),
built when limits or keys change, never per request. A key with nothing
limited on its chain costs one dict lookup.

A request admitted holds a :class:`Ticket`: it counts tokens, and their cost
at its model's price, as they pass (:meth:`Ticket.spend`; streams count one
token per content event, ``usage.tokens_in``, at the output price, corrected
by the engine's usage and the request's cost at the end) and gives its concurrent slot back once
(:meth:`Ticket.end`), whatever ended the request. The route that admits a
request owns its ticket: it takes it and ends it in one ``try``/``finally``
(``app.py`` for forwarded requests, ``workflow_routes.py`` for pictures and,
when the job ends, jobs); the forwarding only spends from it.

The counts of day and month budgets, tokens and money (in nanos, under
``cost:SUBJECT``), go to the store through the control plane
(:meth:`Limiter.unsaved`, :meth:`Limiter.counted`).

Each meter holds ``share`` (this process's part of its plane: a gateway
worker's ``1 / workers``) times its plane's share of that subject, which the
leader divides between the planes serving /v1 (:meth:`Limiter.shared`,
``core/limitshares.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping

from llmgw.core.flowqueue import DEFAULT_PRIORITY
from llmgw.core.limits import (
    COST_PREFIX,
    Limits,
    Meter,
    Refusal,
    admit,
    cost_subject,
    headroom,
    key_subject,
    priority_of,
)
from llmgw.core.limitshares import PlaneShares
from llmgw.core.pricing import Price, Prices, nanos
from llmgw.gateway.api_errors import ApiError, sse_error_event
from llmgw.gateway.keys import KeyEntry

HINT = (
    "wait for the time Retry-After says, or ask an administrator for a higher limit ('llmgw ctl limits get')"
)


class Ticket:
    """One admitted request's hold on its meters."""

    __slots__ = ("_clock", "_output_nanos", "cost_counted", "counted", "meters", "price", "released")

    def __init__(
        self, meters: tuple[Meter, ...], clock: Callable[[], float], price: Price | None = None
    ) -> None:
        self.meters = meters
        self._clock = clock
        self.price = price
        """The model's price when the request was admitted (None: it has none)."""
        self._output_nanos = 0.0 if price is None else price.output * 1_000
        """Nanos a completion token costs (its price per million is per 10⁶ tokens, 10⁹ nanos)."""
        self.counted = 0
        """Tokens counted so far for this request."""
        self.cost_counted = 0
        """Money (nanos) counted so far for this request."""
        self.released = False

    def spend(self, tokens: int, cost_nanos: int | None = None) -> Refusal | None:
        """Count ``tokens`` that passed and what they cost (None: completion tokens at the output
        price); the refusal of a budget this ran out, if any."""
        if cost_nanos is None:
            cost_nanos = round(tokens * self._output_nanos)
        if tokens == 0 and cost_nanos == 0:
            return None
        now = self._clock()
        self.counted += tokens
        self.cost_counted += cost_nanos
        spent = None
        for meter in self.meters:
            if meter.spend(tokens, now, cost_nanos) and spent is None:
                spent = meter
        return None if spent is None else spent.budget(now)

    def settle(self, total_tokens: int, cost: float = 0.0) -> None:
        """The engine's own count for the whole request, and its cost, replace what was counted as it
        passed (``total_tokens`` 0: unknown, what was counted stands)."""
        if total_tokens > 0:
            tokens, cost_nanos = total_tokens - self.counted, nanos(cost) - self.cost_counted
            if tokens or cost_nanos:
                self.spend(tokens, cost_nanos)

    def end(self, total_tokens: int, cost: float = 0.0) -> None:
        """The request ended having used ``total_tokens`` costing ``cost`` (0 tokens: unknown, what
        was counted stands): :meth:`settle`, then :meth:`release`. Called once by whoever admitted
        the request."""
        self.settle(total_tokens, cost)
        self.release()

    def release(self) -> None:
        """The request ended: its concurrent slot is free (once, however often called)."""
        if not self.released:
            self.released = True
            for meter in self.meters:
                meter.concurrent -= 1


def refused(refusal: Refusal, meters: tuple[Meter, ...], now: float) -> ApiError:
    """The 429 (or 401/403) for ``refusal``, with OpenAI's rate-limit headers."""
    headers: list[tuple[bytes, bytes]] = []
    for name, (limit, remaining, reset_s) in headroom(meters, now).items():
        headers.append((f"x-ratelimit-limit-{name}".encode(), str(limit).encode()))
        headers.append((f"x-ratelimit-remaining-{name}".encode(), str(remaining).encode()))
        headers.append((f"x-ratelimit-reset-{name}".encode(), f"{reset_s:.3f}s".encode()))
    retry = None if math.isinf(refusal.retry_after_s) else max(1, math.ceil(refusal.retry_after_s))
    hint = HINT if retry is not None else "ask an administrator to change the limits ('llmgw ctl limits get')"
    return ApiError(
        refusal.status,
        f"Limit {refusal.limit} of {refusal.subject}: {refusal.message}.",
        refusal.code,
        hint=hint,
        retry_after=retry,
        headers=tuple(headers),
    )


def limit_message(refusal: Refusal) -> str:
    """What a stream cut short by a limit tells its client."""
    return (
        f"Limit {refusal.limit} of {refusal.subject}: {refusal.message}; the answer was cut short. "
        "Retry when the budget renews, or ask an administrator for a higher limit."
    )


def cut_short(refusal: Refusal) -> bytes:
    """The end of a stream whose tokens ran a budget out: an error event, then ``[DONE]``."""
    return sse_error_event(limit_message(refusal), refusal.code, "rate_limit_error") + b"data: [DONE]\n\n"


class Limiter:
    """Every limited subject's meter, and per key the meters its requests count against."""

    def __init__(self, clock: Callable[[], float] = time.time, share: float = 1.0, plane: str = "") -> None:
        self.clock = clock
        self.share = share
        """The part of its plane's share this process enforces (a gateway worker's: 1 / workers)."""
        self.plane = plane
        """The control plane this process serves for: it picks that plane's shares."""
        self._plane_share = 1.0
        self._plane_subjects: dict[str, float] = {}
        self._limits: dict[str, Limits] = {}
        self._meters: dict[str, Meter] = {}
        self._chains: dict[str, tuple[str, ...]] = {}
        self._by_key: dict[str, tuple[Meter, ...]] = {}
        self._priorities: dict[str, int] = {}
        self._prices = Prices()

    # -- changes (from the control plane) ----------------------------------------------------------

    def replace_limits(self, limits: Mapping[str, Limits]) -> None:
        """Make ``limits`` (by subject) the whole set; counts of subjects still limited are kept."""
        now = self.clock()
        meters: dict[str, Meter] = {}
        for subject, value in limits.items():
            if not value.metered:
                continue
            meter = self._meters.get(subject)
            if meter is None:
                meter = Meter(subject, value, now, self._share_of(subject))
                meter.currency = self._prices.currency
            else:
                meter.set_limits(value, now)
            meters[subject] = meter
        self._limits = dict(limits)
        self._meters = meters
        self._rebuild()

    @property
    def prices(self) -> Prices:
        """The models' prices (``GatewayFeed.prices_replaced``): what requests cost."""
        return self._prices

    @prices.setter
    def prices(self, prices: Prices) -> None:
        self._prices = prices
        for meter in self._meters.values():
            meter.currency = prices.currency

    def _share_of(self, subject: str) -> float:
        return self.share * self._plane_subjects.get(subject, self._plane_share)

    def shared(self, shares: PlaneShares) -> None:
        """The planes' shares as the leader divided them: every meter takes this plane's."""
        self._plane_share, self._plane_subjects = shares.of(self.plane)
        now = self.clock()
        for subject, meter in self._meters.items():
            share = self._share_of(subject)
            if share != meter.share:
                meter.set_limits(meter.limits, now, share)

    def replace_keys(self, keys: Iterable[KeyEntry]) -> None:
        """The keys as they are now: each key's chain of subjects."""
        self._chains = {
            k.key_id: (key_subject(k.key_id), *(str(owner) for owner in k.place.chain)) for k in keys
        }
        self._rebuild()

    def _rebuild(self) -> None:
        meters, limits = self._meters, self._limits
        by_key: dict[str, tuple[Meter, ...]] = {}
        priorities: dict[str, int] = {}
        for key_id, chain in self._chains.items():
            held = tuple(meters[s] for s in chain if s in meters)
            if held:
                by_key[key_id] = held
            if any(limits[s].priority is not None for s in chain if s in limits):
                owners = (limits[s] for s in chain[1:] if s in limits)
                priorities[key_id] = priority_of(limits.get(chain[0]), owners)
        self._by_key = by_key
        self._priorities = priorities

    def counted(self, used: Mapping[str, tuple[int, int]]) -> None:
        """Tokens and money spent this day and month per subject as the store holds them; what this
        process counted and has not handed out yet (:meth:`unsaved`) is added."""
        for subject, meter in self._meters.items():
            day, month = used.get(subject, (0, 0))
            meter.day_used, meter.month_used = day + meter.unsaved, month + meter.unsaved
            day, month = used.get(cost_subject(subject), (0, 0))
            meter.cost_day_used, meter.cost_month_used = day + meter.unsaved_cost, month + meter.unsaved_cost

    def unsaved(self) -> dict[str, int]:
        """Tokens counted per subject since the last call, and money (nanos) under ``cost:SUBJECT``:
        what the control plane writes next."""
        out: dict[str, int] = {}
        for subject, meter in self._meters.items():
            if meter.unsaved:
                out[subject] = meter.unsaved
                meter.unsaved = 0
            if meter.unsaved_cost:
                out[cost_subject(subject)] = meter.unsaved_cost
                meter.unsaved_cost = 0
        return out

    def totals(self) -> dict[str, tuple[int, int]]:
        """Each limited subject's day and month counts as held here, money under ``cost:SUBJECT``."""
        out: dict[str, tuple[int, int]] = {}
        for subject, meter in self._meters.items():
            out[subject] = (meter.day_used, meter.month_used)
            if meter.cost_day_used or meter.cost_month_used:
                out[cost_subject(subject)] = (meter.cost_day_used, meter.cost_month_used)
        return out

    def add_counted(self, used: Mapping[str, int]) -> None:
        """What another process (a worker) counted, tokens and money: into the meters as if counted
        here (written, then sent on)."""
        for name, amount in used.items():
            is_cost = name.startswith(COST_PREFIX)
            meter = self._meters.get(name[len(COST_PREFIX) :] if is_cost else name)
            if meter is None or amount <= 0:
                continue
            if is_cost:
                meter.unsaved_cost += amount
                meter.cost_day_used += amount
                meter.cost_month_used += amount
            else:
                meter.unsaved += amount
                meter.day_used += amount
                meter.month_used += amount

    def limits(self) -> dict[str, Limits]:
        return dict(self._limits)

    def meter(self, subject: str) -> Meter | None:
        return self._meters.get(subject)

    # -- the request path ------------------------------------------------------------------------

    def priority(self, key: KeyEntry | None) -> int:
        """The highest queue priority ``key``'s requests may have (:func:`~llmgw.core.limits.priority_of`)."""
        if key is None:
            return DEFAULT_PRIORITY
        return self._priorities.get(key.key_id, DEFAULT_PRIORITY)

    def admit(self, key: KeyEntry, model: str) -> Ticket | None:
        """A ticket for one request of ``key`` for ``model`` (None: nothing limits the key), or ApiError."""
        meters = self._by_key.get(key.key_id)
        if meters is None:
            return None
        now = self.clock()
        refusal = admit(meters, model, now)
        if refusal is not None:
            raise refused(refusal, meters, now)
        return Ticket(meters, self.clock, self._prices.of(model))

    def may_use(self, key: KeyEntry, model: str) -> bool:
        """Whether ``key``'s limits let it use ``model`` (the models they allow, none expired),
        taking nothing: an admitted request's check of a model it may fall to."""
        meters = self._by_key.get(key.key_id)
        if meters is None:
            return True
        now = self.clock()
        return all(meter.refuses_model(model, now) is None for meter in meters)

    def refuse_expired(self, key: KeyEntry) -> None:
        """401 when ``key``, or a subject of its chain, has expired, as :meth:`admit` answers: for
        routes that admit no request but answer what the key sees (``GET /v1/models``)."""
        meters = self._by_key.get(key.key_id)
        if meters is None:
            return
        now = self.clock()
        for meter in meters:
            refusal = meter.expiry(now)
            if refusal is not None:
                raise refused(refusal, meters, now)
