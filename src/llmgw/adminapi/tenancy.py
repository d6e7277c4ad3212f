"""The admin API's shapes for tenancy: organizations, teams, projects, users, roles and users' tokens.

Names are checked as :func:`llmgw.core.tenancy.check_name` checks them
(letters, digits, ``.``, ``_``, ``-``; 63 at most), so nothing the store
cannot keep gets past the request's model.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, Field

from llmgw.adminapi.schemas import AnswerModel, RequestModel
from llmgw.adminapi.textfields import keepable
from llmgw.core.tenancy import Role, check_name, owner_text

Name = Annotated[str, AfterValidator(check_name)]
"""An organization's, team's, project's or user's own name."""

MAX_TOKEN_LIFE_S = 10 * 365 * 86400
"""The longest a user's token may live: ten years."""


def _role(value: str) -> str:
    return Role.parse(value).label


class OrgRequest(RequestModel):
    name: Name


class TeamRequest(RequestModel):
    org: Name
    """The organization the team belongs to."""
    name: Name


class ProjectRequest(RequestModel):
    org: Name
    team: Name
    """The team (of ``org``) the project belongs to."""
    name: Name


class UnitView(AnswerModel):
    """An organization, team or project."""

    owner: str
    """As models and keys name it: ``org:acme``, ``team:acme/ml``, ``project:acme/ml/chat``."""
    path: str
    """``acme``, ``acme/ml``, ``acme/ml/chat``."""
    created_at: datetime


class UserRequest(RequestModel):
    name: Name


class RoleView(AnswerModel):
    role: str
    """``viewer``, ``member``, ``team-admin``, ``org-admin`` or ``cluster-admin``."""
    scope: str
    """Where: empty (the cluster), ``org:ORG`` or ``team:ORG/TEAM``."""


class UserView(AnswerModel):
    name: str
    created_at: datetime
    roles: list[RoleView] = []


class RoleRequest(RequestModel):
    """Give a user a role at a scope (replacing the one held there): membership of an org or team."""

    role: Annotated[str, AfterValidator(_role)]
    scope: Annotated[str, Field(max_length=200), AfterValidator(owner_text)] = ""
    """Empty (the cluster), ``org:ORG`` or ``team:ORG/TEAM``."""


class TokenRequest(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=128), AfterValidator(keepable)]
    """Where the token is used (a laptop, a CI job)."""
    expires_in_s: Annotated[int, Field(ge=60, le=MAX_TOKEN_LIFE_S)] | None = None
    """Seconds until the token stops working (none: it works until revoked)."""


class TokenView(AnswerModel):
    id: str
    user: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(AnswerModel):
    id: str
    user: str
    name: str
    token: str
    """The secret, shown this once."""
    expires_at: datetime | None


class WhoView(AnswerModel):
    """Who the token belongs to, with the roles it acts with."""

    name: str
    roles: list[RoleView]
