"""Tenancy: who owns a model, where a key or user sits, what each may see, and what each role may do.

::

    cluster                      owner of public things; cluster admins act here
    └── org:acme                 an organization
        └── team:acme/ml         a team of the organization
            └── project:acme/ml/chat   a project of the team (keys live here)
    user:alice                   a user (keys of her own; members of orgs and teams)

An :class:`Owner` is one node of that tree, written ``kind:path`` (the
cluster is ``""``). A :class:`Place` is where a key or a user sits: what it
*sees* (:func:`visible`) is what is public and what is owned at or above it
(its project, the project's team and organization; for a user, the user and
the teams and organizations the user belongs to). To anyone else a model or
adapter does not exist.

What a user may *do* through ``/api`` follows the user's role bindings
(:class:`Binding`: a :class:`Role` at the cluster, an organization or a
team): :func:`may` answers a :class:`Permission` with its reason, in the
style of :mod:`llmgw.core.placement`. A binding covers its scope and
everything below it.

These types are small and stable on purpose: limits and usage per key,
project, team or organization hang off :class:`Owner` (a hashable key) and
:attr:`Place.chain` (the owners a key's use counts against, nearest first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""One name in an owner's path: an organization's, team's, project's or user's."""


class OwnerKind(StrEnum):
    """What kind of thing owns (or where a key sits), from the top of the tree down."""

    CLUSTER = "cluster"
    ORG = "org"
    TEAM = "team"
    PROJECT = "project"
    USER = "user"


DEPTH = {OwnerKind.ORG: 1, OwnerKind.TEAM: 2, OwnerKind.PROJECT: 3, OwnerKind.USER: 1}
"""Names in the path of each kind (``org``, ``org/team``, ``org/team/project``, ``user``)."""


def check_name(value: str, what: str = "name") -> str:
    """``value`` when it is a valid name of an organization, team, project or user; else ValueError."""
    if not SEGMENT.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} must start with a letter or digit and hold only letters, digits, '.', "
            "'_' and '-' (63 at most)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns a model or adapter, or where a key sits: the cluster, an org, team, project or user.

    ``path`` names it from its organization down (``acme/ml/chat`` for a
    project); a user's path is the user's name; the cluster's is empty.
    """

    kind: OwnerKind = OwnerKind.CLUSTER
    path: str = ""

    def __post_init__(self) -> None:
        if self.kind is OwnerKind.CLUSTER:
            if self.path:
                raise ValueError("the cluster has no path; write it as an empty owner")
            return
        names = self.path.split("/")
        if len(names) != DEPTH[self.kind]:
            shape = {
                OwnerKind.ORG: "org:ORG",
                OwnerKind.TEAM: "team:ORG/TEAM",
                OwnerKind.PROJECT: "project:ORG/TEAM/PROJECT",
                OwnerKind.USER: "user:NAME",
            }[self.kind]
            raise ValueError(f"{self.kind.value} {self.path!r} is not of the shape {shape}")
        for name in names:
            check_name(name)

    @classmethod
    def parse(cls, text: str) -> Owner:
        """An owner from its text: ``""`` (or ``cluster``), ``org:acme``, ``team:acme/ml``,
        ``project:acme/ml/chat``, ``user:alice``; ValueError saying the shapes otherwise."""
        text = text.strip()
        if text in ("", OwnerKind.CLUSTER.value):
            return CLUSTER
        kind, colon, path = text.partition(":")
        known = {k.value: k for k in OwnerKind if k is not OwnerKind.CLUSTER}
        if not colon or kind not in known:
            raise ValueError(
                f"owner {text!r} is not one of: empty (the cluster), org:ORG, team:ORG/TEAM, "
                "project:ORG/TEAM/PROJECT, user:NAME"
            )
        return cls(known[kind], path)

    @property
    def public(self) -> bool:
        """Owned by the cluster: every key sees it."""
        return self.kind is OwnerKind.CLUSTER

    @property
    def org(self) -> str:
        """The organization's name for an org, team or project; empty otherwise."""
        if self.kind in (OwnerKind.ORG, OwnerKind.TEAM, OwnerKind.PROJECT):
            return self.path.split("/")[0]
        return ""

    def parent(self) -> Owner | None:
        """The owner one step up (a project's team, a team's org; the cluster above an org or user)."""
        if self.kind is OwnerKind.CLUSTER:
            return None
        if self.kind in (OwnerKind.ORG, OwnerKind.USER):
            return CLUSTER
        up = OwnerKind.ORG if self.kind is OwnerKind.TEAM else OwnerKind.TEAM
        return Owner(up, self.path.rsplit("/", 1)[0])

    def lineage(self) -> tuple[Owner, ...]:
        """This owner and every one above it, nearest first, the cluster last."""
        chain: list[Owner] = []
        at: Owner | None = self
        while at is not None:
            chain.append(at)
            at = at.parent()
        return tuple(chain)

    def within(self, scope: Owner) -> bool:
        """Whether this owner is ``scope`` or below it (everything is within the cluster)."""
        return scope in self.lineage()

    def __str__(self) -> str:
        return "" if self.kind is OwnerKind.CLUSTER else f"{self.kind.value}:{self.path}"


CLUSTER = Owner()
"""The cluster: owner of public things."""


def owner_text(text: str) -> str:
    """``text`` as an owner's canonical text (a pydantic validator); ValueError when it is no owner."""
    return str(Owner.parse(text))


@dataclass(frozen=True, slots=True)
class Place:
    """Where a key or user sits: ``at`` (a project, a user, or the cluster), and for a user, the
    organizations and teams the user belongs to.

    :attr:`reach` is every owner whose things this place sees besides public ones.
    """

    at: Owner = CLUSTER
    memberships: frozenset[Owner] = frozenset()
    """A user's organizations and teams (each team brings its organization)."""
    reach: frozenset[Owner] = field(init=False, compare=False, repr=False)
    chain: tuple[Owner, ...] = field(init=False, compare=False, repr=False)
    """The owners this place's use counts against, nearest first: the project, its team, its
    organization (or the user); never the cluster."""

    def __post_init__(self) -> None:
        reach: set[Owner] = set()
        for owner in (self.at, *self.memberships):
            reach.update(o for o in owner.lineage() if not o.public)
        object.__setattr__(self, "reach", frozenset(reach))
        object.__setattr__(self, "chain", tuple(o for o in self.at.lineage() if not o.public))


NOWHERE = Place()
"""A key of no project nor user: it sees public things only."""


def visible(owner: Owner, place: Place) -> bool:
    """Whether a key or user at ``place`` sees (and may use) what ``owner`` owns: public things, and
    those owned at or above the place. To anyone else the thing does not exist."""
    return owner.kind is OwnerKind.CLUSTER or owner in place.reach


class Role(IntEnum):
    """What a user may do where bound; a higher role may do all a lower one may."""

    VIEWER = 1
    """Reads what is there."""
    MEMBER = 2
    """Also adds, changes and removes models, adapters and keys."""
    TEAM_ADMIN = 3
    """Also manages projects and members of the team."""
    ORG_ADMIN = 4
    """Also manages teams and members of the organization."""
    CLUSTER_ADMIN = 5
    """Everything: nodes, settings, mirror, organizations, users."""

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> Role:
        """A role from its label: ``viewer``, ``member``, ``team-admin``, ``org-admin``, ``cluster-admin``."""
        for role in cls:
            if role.label == text.strip().lower():
                return role
        raise ValueError(f"role {text!r} is not one of: {', '.join(r.label for r in cls)}")


BOUND_AT = {
    Role.CLUSTER_ADMIN: frozenset({OwnerKind.CLUSTER}),
    Role.ORG_ADMIN: frozenset({OwnerKind.ORG}),
    Role.TEAM_ADMIN: frozenset({OwnerKind.TEAM}),
    Role.MEMBER: frozenset({OwnerKind.CLUSTER, OwnerKind.ORG, OwnerKind.TEAM}),
    Role.VIEWER: frozenset({OwnerKind.CLUSTER, OwnerKind.ORG, OwnerKind.TEAM}),
}
"""Where each role may be bound."""


@dataclass(frozen=True, slots=True)
class Binding:
    """A user's role at a scope (the cluster, an organization or a team); it covers everything below."""

    role: Role
    scope: Owner = CLUSTER

    def __post_init__(self) -> None:
        if self.scope.kind not in BOUND_AT[self.role]:
            kinds = " or ".join(sorted(k.value for k in BOUND_AT[self.role]))
            raise ValueError(f"{self.role.label} is bound at the {kinds}, not at {self.scope or 'cluster'}")

    def covers(self, owner: Owner) -> bool:
        return owner.within(self.scope)


class Action(StrEnum):
    """What a request does to what an owner owns."""

    READ = "read"
    """See it (models, keys, members, usage)."""
    WRITE = "write"
    """Add, change or remove models, adapters and keys."""
    MANAGE = "manage"
    """Create or remove teams and projects, add or remove members."""
    OPERATE = "operate"
    """Run the cluster: nodes, replicas, settings, serving, organizations, users."""


NEEDS = {
    Action.READ: Role.VIEWER,
    Action.WRITE: Role.MEMBER,
    Action.MANAGE: Role.TEAM_ADMIN,
    Action.OPERATE: Role.CLUSTER_ADMIN,
}
"""The least role each action needs over the owner it touches."""


@dataclass(frozen=True, slots=True)
class Permission:
    """Whether an action is allowed, and why (or why not)."""

    allowed: bool
    reason: str

    def __bool__(self) -> bool:
        return self.allowed


def role_over(bindings: Sequence[Binding], owner: Owner) -> Role | None:
    """The highest role of ``bindings`` that covers ``owner`` (None: none covers it)."""
    roles = [b.role for b in bindings if b.covers(owner)]
    return max(roles) if roles else None


def may(bindings: Sequence[Binding], action: Action, owner: Owner) -> Permission:
    """Whether a user with ``bindings`` may do ``action`` to what ``owner`` owns.

    The action needs a role (:data:`NEEDS`) bound at ``owner`` or above it. A
    user acts as a member over what the user owns: ``user:NAME``'s own keys.
    """
    needed = NEEDS[action]
    held = role_over(bindings, owner)
    where = str(owner) or "the cluster"
    if held is not None and held >= needed:
        return Permission(True, f"{held.label} over {where}")
    if held is None:
        return Permission(False, f"{action.value} on {where} needs {needed.label} there or above; none held")
    return Permission(False, f"{action.value} on {where} needs {needed.label}; {held.label} held")


def may_as(user: str, bindings: Sequence[Binding], action: Action, owner: Owner) -> Permission:
    """:func:`may`, with ``user`` a member over what ``user:NAME`` owns (the user's own keys)."""
    own = owner.kind is OwnerKind.USER and owner.path == user
    if own and NEEDS[action] <= Role.MEMBER:
        return Permission(True, f"{owner} is the user's own")
    return may(bindings, action, owner)


def user_place(user: str, bindings: Sequence[Binding]) -> Place:
    """Where a user sits: the user, and the organizations and teams the user is bound at."""
    return Place(Owner(OwnerKind.USER, user), frozenset(b.scope for b in bindings if not b.scope.public))
