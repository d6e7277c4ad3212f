"""Limits on a key, project, team, organization or user, and the arithmetic that enforces them.

A :class:`Limits` caps requests and tokens per minute, concurrent requests,
tokens per day and per month (UTC), money per day and per month (in the
cluster's currency, :mod:`llmgw.core.pricing`), the models allowed and (for a
key) an expiry. It is set on a *subject*: ``key:ID`` or an owner's text
(``project:acme/ml/chat``, ``team:acme/ml``, ``org:acme``, ``user:alice``). A
request counts against its key and every owner of its key's
:attr:`~llmgw.core.tenancy.Place.chain`; it is admitted only when every one
of those :class:`Meter` s admits it (:func:`admit`).

Per minute a meter is a token bucket (capacity the limit, refilled at the
limit per 60 s); tokens are taken as they pass, so a bucket may go below zero
and then refuses until it has refilled above zero. Per day and month it is a
sum that starts again at the period's start. Everything here is plain
arithmetic on floats: the caller passes the time (``now``: Unix seconds).

Several processes enforcing one limit each hold a :attr:`Meter.share` of it
of its rates and concurrency (docs/tenancy.md, Limits): with shares summing to
one, the cluster admits at most the limit plus what is in flight when shares
move. Day and month budgets are held whole: every process counts against the
cluster's total, which reaches it every second.

Money is counted as tokens are, in whole nanos of the currency
(:func:`llmgw.core.pricing.nanos`), under the subject's money counter
(:func:`cost_subject`: ``cost:project:acme/ml/chat``) beside its tokens, so
the counts travel, add up and are stored as the tokens' do. A stream counts
each token passing at the model's output price; the engine's usage at the
end puts the request's exact cost in its place. A spent money budget is
refused with 429 ``budget_exceeded``.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from llmgw.core.flowqueue import DEFAULT_PRIORITY, HIGHEST_PRIORITY, LOWEST_PRIORITY
from llmgw.core.pricing import DEFAULT_CURRENCY, money, nanos
from llmgw.core.tenancy import Owner

KEY_PREFIX = "key:"
COST_PREFIX = "cost:"
DAY_S = 86_400.0
BUDGET_EXCEEDED = "budget_exceeded"
"""The code of a refusal for a spent money budget."""


def subject_text(text: str) -> str:
    """``text`` as a limit subject's canonical text (``key:ID`` or an owner); ValueError otherwise."""
    text = text.strip()
    if text.startswith(KEY_PREFIX):
        key_id = text[len(KEY_PREFIX) :]
        if (
            not key_id
            or len(key_id) > 64
            or not key_id.isascii()
            or not key_id.replace("-", "").replace("_", "").isalnum()
        ):
            raise ValueError(
                f"key id {key_id!r} must be 1-64 letters, digits, '-' or '_' (see 'llmgw ctl key list')"
            )
        return text
    owner = Owner.parse(text)
    if owner.public:
        raise ValueError(
            "limits are set on a key (key:ID), project, team, organization or user, not the cluster"
        )
    return str(owner)


def key_subject(key_id: str) -> str:
    return KEY_PREFIX + key_id


def cost_subject(subject: str) -> str:
    """The counter of the money ``subject`` spent (in nanos), beside its tokens' counter."""
    return COST_PREFIX + subject


def is_cost_subject(name: str) -> bool:
    return name.startswith(COST_PREFIX)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one key, project, team, organization or user may use; None: no limit on that."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    """Prompt plus completion tokens."""
    concurrent: int | None = None
    """Requests answered at once."""
    tokens_per_day: int | None = None
    """Prompt plus completion tokens per UTC day."""
    tokens_per_month: int | None = None
    """Prompt plus completion tokens per UTC calendar month."""
    usd_per_day: float | None = None
    """Money per UTC day, in the cluster's currency (``pricing.currency``, USD unless set)."""
    usd_per_month: float | None = None
    """Money per UTC calendar month, in the cluster's currency."""
    models: frozenset[str] | None = None
    """The models (or adapters) that may be asked for; None: every model the key sees."""
    expires_s: float | None = None
    """Unix time after which requests are refused (meant for keys)."""
    priority: int | None = None
    """Where its requests wait in a busy model's queue, 0 (lowest, sheddable) to 9 (``gateway.flow``,
    :func:`priority_of`): not a limit on use, but set and inherited as the limits are."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("models", "expires_s", "priority") or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{f.name} must be a number, not {value!r}")
            if value < 0:
                raise ValueError(f"{f.name} must be 0 or more, not {value}")
        if self.priority is not None and (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not LOWEST_PRIORITY <= self.priority <= HIGHEST_PRIORITY
        ):
            raise ValueError(
                f"priority must be a whole number from {LOWEST_PRIORITY} (lowest, sheddable) to "
                f"{HIGHEST_PRIORITY}, not {self.priority!r}"
            )

    @property
    def empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    @property
    def metered(self) -> bool:
        """Whether a :class:`Meter` has anything to enforce (a priority alone needs none)."""
        return any(getattr(self, f.name) is not None for f in fields(self) if f.name != "priority")

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = sorted(value) if f.name == "models" else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Limits:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {sorted(known)}")
        values = dict(data)
        if values.get("models") is not None:
            models = values["models"]
            assert isinstance(models, Iterable)
            values["models"] = frozenset(str(m) for m in models)
        return cls(**values)  # type: ignore[arg-type]


def day_of(now: float) -> int:
    """The UTC day number of Unix time ``now``."""
    return int(now // DAY_S)


def month_of(now: float) -> int:
    """The UTC month of Unix time ``now`` as ``year * 12 + month - 1``."""
    t = time.gmtime(now)
    return t.tm_year * 12 + t.tm_mon - 1


def next_month_s(month: int) -> float:
    """Unix time the month after ``month`` (:func:`month_of`) starts."""
    year, index = divmod(month + 1, 12)
    return float(calendar.timegm((year, index + 1, 1, 0, 0, 0, 0, 0, 0)))


def priority_of(key: Limits | None, owners: Iterable[Limits]) -> int:
    """The queue priority of a key's requests: its own ``priority`` may lower its owners', never
    raise it.

    ``owners`` are the limits of the key's place's chain (project, team, organization, or user):
    the lowest priority any of them sets caps the key's, :data:`~llmgw.core.flowqueue.DEFAULT_PRIORITY`
    when none sets one. So whoever may set a subject's limits (the manager of the owner above it)
    decides how far up its requests may go, and a project member can only send theirs lower.
    """
    cap = min((o.priority for o in owners if o.priority is not None), default=DEFAULT_PRIORITY)
    own = None if key is None else key.priority
    return cap if own is None else min(own, cap)


class Bucket:
    """A token bucket: ``capacity`` at most, refilled at ``capacity`` per ``period_s``."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, capacity: float, period_s: float, now: float) -> None:
        self.capacity = capacity
        self.rate = capacity / period_s
        self.level = capacity
        self.stamp = now

    def refill(self, now: float) -> float:
        elapsed = now - self.stamp
        if elapsed > 0:
            self.level = min(self.capacity, self.level + elapsed * self.rate)
            self.stamp = now
        return self.level

    def wait_s(self, need: float) -> float:
        """Seconds until the level reaches ``need`` (0 when it has)."""
        short = need - self.level
        return 0.0 if short <= 0 else (math.inf if self.rate <= 0 else short / self.rate)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused, by which subject, and when it may be tried again."""

    subject: str
    limit: str
    """The limit's name (a :class:`Limits` field)."""
    message: str
    retry_after_s: float
    status: int = 429
    code: str = "rate_limit_exceeded"


INF = math.inf


class Meter:
    """One subject's counters for its :class:`Limits` (a ``share`` of each, 1: all of it).

    The request path calls :meth:`take` and :meth:`spend` only: caps and the ends of the day and
    month are worked out when the limits change, so each call is a few comparisons.
    """

    __slots__ = (
        "concurrent",
        "concurrent_cap",
        "cost_day_cap",
        "cost_day_used",
        "cost_month_cap",
        "cost_month_used",
        "currency",
        "day",
        "day_cap",
        "day_end",
        "day_used",
        "gated",
        "limits",
        "month",
        "month_cap",
        "month_end",
        "month_used",
        "requests",
        "share",
        "subject",
        "tokens",
        "unsaved",
        "unsaved_cost",
    )

    def __init__(self, subject: str, limits: Limits, now: float, share: float = 1.0) -> None:
        self.subject = subject
        self.share = share
        self.concurrent = 0
        self.day_used = 0
        self.month_used = 0
        self.unsaved = 0
        """Tokens counted since the counts were last written."""
        self.cost_day_used = self.cost_month_used = 0
        """Money spent this day and month, in nanos of the currency."""
        self.unsaved_cost = 0
        """Money (nanos) counted since the counts were last written."""
        self.currency = DEFAULT_CURRENCY
        """The currency money budgets are in (as refusals name it)."""
        self._start_periods(now)
        self.limits = limits
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None
        self.set_limits(limits, now)

    def _start_periods(self, now: float) -> None:
        self.day = day_of(now)
        self.day_end = (self.day + 1) * DAY_S
        self.month = month_of(now)
        self.month_end = next_month_s(self.month)

    def set_limits(self, limits: Limits, now: float, share: float | None = None) -> None:
        """New limits (or a new share) keep what was counted. New limits: a bucket keeps its level,
        capped. A new share of the same limits: a bucket keeps how full it was (its level scales with
        its capacity), so that what one plane's shrinking share takes away the others' growing
        shares add, and the planes together still admit the limit while the leader re-divides it."""
        rescale = share is not None and share != self.share and limits == self.limits
        if share is not None:
            self.share = share
        self.limits = limits
        s = self.share
        self.gated = limits.expires_s is not None or limits.models is not None
        self.concurrent_cap = INF if limits.concurrent is None else limits.concurrent * s
        self.day_cap = INF if limits.tokens_per_day is None else limits.tokens_per_day
        self.month_cap = INF if limits.tokens_per_month is None else limits.tokens_per_month
        self.cost_day_cap = INF if limits.usd_per_day is None else nanos(limits.usd_per_day)
        self.cost_month_cap = INF if limits.usd_per_month is None else nanos(limits.usd_per_month)
        self.requests = _bucket(self.requests, limits.requests_per_minute, s, now, rescale)
        self.tokens = _bucket(self.tokens, limits.tokens_per_minute, s, now, rescale)

    def _roll(self, now: float) -> None:
        """A new UTC day (and maybe month) began: its counts start at zero."""
        month = self.month
        self._start_periods(now)
        self.day_used = self.cost_day_used = 0
        if self.month != month:
            self.month_used = self.cost_month_used = 0

    def check(self, model: str, now: float) -> Refusal | None:
        """Whether one more request for ``model`` is admitted now (nothing is taken)."""
        refusal = self.take(model, now)
        if refusal is None:
            self.untake()
        return refusal

    def take(self, model: str, now: float) -> Refusal | None:
        """Admit one request for ``model`` (taking a request and a concurrent slot), or refuse it."""
        if self.gated:
            refusal = self._gate(model, now)
            if refusal is not None:
                return refusal
        if self.concurrent >= self.concurrent_cap:
            s = self.subject
            return Refusal(s, "concurrent", f"{s} has {self.concurrent} requests in flight, its limit", 1.0)
        bucket = self.requests
        if bucket is not None:
            level = bucket.level + (now - bucket.stamp) * bucket.rate
            bucket.level = level if level < bucket.capacity else bucket.capacity
            bucket.stamp = now
            if bucket.level < 1.0:
                rpm = self.limits.requests_per_minute
                why = f"{self.subject} reached its limit of {rpm} requests per minute"
                return Refusal(self.subject, "requests_per_minute", why, bucket.wait_s(1.0))
        bucket = self.tokens
        if bucket is not None:
            level = bucket.level + (now - bucket.stamp) * bucket.rate
            bucket.level = level if level < bucket.capacity else bucket.capacity
            bucket.stamp = now
            if level <= 0.0:
                tpm = self.limits.tokens_per_minute
                why = f"{self.subject} reached its limit of {tpm} tokens per minute"
                return Refusal(self.subject, "tokens_per_minute", why, bucket.wait_s(1.0))
        if now >= self.day_end:
            self._roll(now)
        if self._spent():
            return self.budget(now)
        if self.requests is not None:
            self.requests.level -= 1.0
        self.concurrent += 1
        return None

    def untake(self) -> None:
        """Give back what :meth:`take` took (another meter of the chain refused the request)."""
        if self.requests is not None:
            self.requests.level += 1.0
        self.concurrent -= 1

    def expiry(self, now: float) -> Refusal | None:
        """The refusal of a subject whose ``expires_s`` has passed (401 ``expired_api_key``), else None."""
        expires_s = self.limits.expires_s
        if expires_s is not None and now >= expires_s:
            s = self.subject
            return Refusal(s, "expires_s", f"{s} expired", INF, 401, "expired_api_key")
        return None

    def refuses_model(self, model: str, now: float) -> Refusal | None:
        """The refusal of a request for ``model`` by the subject's models and expiry (nothing is
        taken): what a request already admitted checks before it falls to another model."""
        return self._gate(model, now) if self.gated else None

    def _gate(self, model: str, now: float) -> Refusal | None:
        limits = self.limits
        s = self.subject
        if limits.expires_s is not None and now >= limits.expires_s:
            return self.expiry(now)
        if limits.models is not None and model not in limits.models:
            why = f"{s} may not use model '{model}'"
            return Refusal(s, "models", why, INF, 403, "model_not_allowed")
        return None

    def _spent(self) -> bool:
        """Whether a day's or month's budget, of tokens or money, is spent."""
        return (
            self.day_used >= self.day_cap
            or self.month_used >= self.month_cap
            or self.cost_day_used >= self.cost_day_cap
            or self.cost_month_used >= self.cost_month_cap
        )

    def budget(self, now: float) -> Refusal | None:
        """A refusal when a day's or month's budget, of tokens or money, is spent."""
        if now >= self.day_end:
            self._roll(now)
        limits = self.limits
        if self.day_used >= self.day_cap:
            return Refusal(
                self.subject,
                "tokens_per_day",
                f"{self.subject} spent its budget of {limits.tokens_per_day} tokens for the day",
                self.day_end - now,
            )
        if self.month_used >= self.month_cap:
            return Refusal(
                self.subject,
                "tokens_per_month",
                f"{self.subject} spent its budget of {limits.tokens_per_month} tokens for the month",
                self.month_end - now,
            )
        if self.cost_day_used >= self.cost_day_cap:
            return self._money_refusal("usd_per_day", self.cost_day_used, limits.usd_per_day, "day", now)
        if self.cost_month_used >= self.cost_month_cap:
            cap = limits.usd_per_month
            return self._money_refusal("usd_per_month", self.cost_month_used, cap, "month", now)
        return None

    def _money_refusal(self, limit: str, spent: int, cap: float | None, period: str, now: float) -> Refusal:
        ends = self.day_end if period == "day" else self.month_end
        resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ends))
        c = self.currency
        why = (
            f"{self.subject} spent {money(spent):.6f} {c} this {period}, its budget is {cap:g} {c}; "
            f"it resets at {resets}"
        )
        return Refusal(self.subject, limit, why, ends - now, code=BUDGET_EXCEEDED)

    def take_request(self) -> None:
        if self.requests is not None:
            self.requests.level -= 1.0
        self.concurrent += 1

    def spend(self, tokens: int, now: float, cost_nanos: int = 0) -> bool:
        """Count ``tokens`` used and ``cost_nanos`` of money spent (negative: a correction of an
        estimate); True when a budget is spent."""
        bucket = self.tokens
        if bucket is not None:
            level = bucket.level + (now - bucket.stamp) * bucket.rate
            bucket.level = (level if level < bucket.capacity else bucket.capacity) - tokens
            bucket.stamp = now
        if now >= self.day_end:
            self._roll(now)
        self.day_used += tokens
        self.month_used += tokens
        self.unsaved += tokens
        if cost_nanos:
            self.cost_day_used += cost_nanos
            self.cost_month_used += cost_nanos
            self.unsaved_cost += cost_nanos
        return self._spent()


def _bucket(
    old: Bucket | None, limit: int | None, share: float, now: float, rescale: bool = False
) -> Bucket | None:
    """A per-minute bucket holding ``share`` of ``limit``: its refill is the share's, its capacity
    at least one (a request takes one whole: a smaller share would never admit any). It takes
    ``old``'s level, capped; with ``rescale`` (only the share changed), as full as ``old`` was."""
    if limit is None:
        return None
    bucket = Bucket(limit * share, 60.0, now)
    if share < 1.0 and 0 < bucket.capacity < 1.0:
        bucket.capacity = bucket.level = 1.0
    if old is not None:
        old.refill(now)
        level = old.level * bucket.capacity / old.capacity if rescale and old.capacity > 0 else old.level
        bucket.level = min(bucket.capacity, level)
    return bucket


def admit(meters: Sequence[Meter], model: str, now: float) -> Refusal | None:
    """Admit a request against every meter (taking one request from each), or the first refusal
    (taking nothing)."""
    for index, meter in enumerate(meters):
        refusal = meter.take(model, now)
        if refusal is not None:
            for taken in meters[:index]:
                taken.untake()
            return refusal
    return None


def headroom(meters: Sequence[Meter], now: float) -> dict[str, tuple[int, int, float]]:
    """``requests``/``tokens`` -> (limit, remaining, seconds to full) of the tightest meter, for
    OpenAI's ``x-ratelimit-*`` headers."""
    out: dict[str, tuple[int, int, float]] = {}
    for meter in meters:
        for name, bucket in (("requests", meter.requests), ("tokens", meter.tokens)):
            if bucket is None:
                continue
            bucket.refill(now)
            remaining = max(0, int(bucket.level))
            if name not in out or remaining < out[name][1]:
                out[name] = (int(bucket.capacity), remaining, bucket.wait_s(bucket.capacity))
    return out
