"""``llmgw ctl org|team|project|user``: the tree models and keys are owned in, users, roles, tokens.

::

    llmgw ctl org create acme
    llmgw ctl team create acme/ml
    llmgw ctl project create acme/ml/chat
    llmgw ctl user create alice
    llmgw ctl team add-member acme/ml alice --role team-admin
    llmgw ctl user token create alice laptop --expires-in 30d
    llmgw ctl key create chat-ci --project acme/ml/chat

Every listing takes ``--json``. Who may do what is in docs/tenancy.md.
"""

from __future__ import annotations

import re

import typer

from llmgw.adminapi.tenancy import UnitView
from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table

org_app = typer.Typer(help="Organizations: they hold teams.", no_args_is_help=True)
team_app = typer.Typer(help="Teams (ORG/TEAM): they hold projects.", no_args_is_help=True)
project_app = typer.Typer(
    help="Projects (ORG/TEAM/PROJECT): keys and models live here.", no_args_is_help=True
)
user_app = typer.Typer(help="Users, their roles and their tokens for /api.", no_args_is_help=True)
token_app = typer.Typer(help="A user's tokens for /api and ctl.", no_args_is_help=True)
user_app.add_typer(token_app, name="token")

ROLE = typer.Option("member", "--role", help="viewer, member, team-admin (teams), org-admin (orgs).")
UNITS = {"org": "orgs", "team": "teams", "project": "projects"}
SPANS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(span: str) -> int:
    """``90``, ``15m``, ``12h``, ``30d`` as seconds."""
    found = re.fullmatch(r"(\d+)([smhd]?)", span.strip())
    if not found:
        raise typer.BadParameter("write a span like 3600, 15m, 12h or 30d", param_hint="--expires-in")
    return int(found.group(1)) * SPANS[found.group(2) or "s"]


def _show_units(rows: list[UnitView], as_json: bool) -> None:
    if as_json:
        print_json(rows)
        return
    table(
        ["PATH", "OWNER", "CREATED"],
        [(u.path, u.owner, u.created_at.strftime("%Y-%m-%d %H:%M:%S")) for u in rows],
    )


def _body(kind: str, path: str) -> dict[str, str]:
    names = path.split("/")
    fields = {"org": ["name"], "team": ["org", "name"], "project": ["org", "team", "name"]}[kind]
    if len(names) != len(fields) or not all(names):
        shape = {"org": "ORG", "team": "ORG/TEAM", "project": "ORG/TEAM/PROJECT"}[kind]
        raise typer.BadParameter(f"write the {kind} as {shape}", param_hint=kind.upper())
    return dict(zip(fields, names, strict=True))


def _unit_commands(app: typer.Typer, kind: str, within_help: str) -> None:
    plural = UNITS[kind]

    @app.command("create")
    def create(path: str = typer.Argument(...), url: str | None = URL, token: str | None = TOKEN) -> None:
        unit = client(url, token).create_unit(plural, _body(kind, path))
        console.print(f"created {unit.owner}")

    @app.command("list")
    def listing(
        within: str = typer.Option("", "--in", help=within_help),
        url: str | None = URL,
        token: str | None = TOKEN,
        as_json: bool = AS_JSON,
    ) -> None:
        _show_units(client(url, token).units(plural, within), as_json)

    @app.command("delete")
    def delete(path: str = typer.Argument(...), url: str | None = URL, token: str | None = TOKEN) -> None:
        _body(kind, path)
        client(url, token).remove_unit(plural, path)
        console.print(f"deleted {kind}:{path}")

    create.__doc__ = f"Create a {kind}."
    listing.__doc__ = f"List the {plural} you see."
    delete.__doc__ = f"Delete a {kind} (it may own no model nor hold an active key)."

    if kind == "project":
        return

    @app.command("add-member")
    def add_member(
        path: str = typer.Argument(...),
        user: str = typer.Argument(...),
        role: str = ROLE,
        url: str | None = URL,
        token: str | None = TOKEN,
    ) -> None:
        _body(kind, path)
        client(url, token).bind_role(user, role, f"{kind}:{path}")
        console.print(f"{user} is {role} of {kind}:{path}")

    @app.command("remove-member")
    def remove_member(
        path: str = typer.Argument(...),
        user: str = typer.Argument(...),
        url: str | None = URL,
        token: str | None = TOKEN,
    ) -> None:
        _body(kind, path)
        client(url, token).unbind_role(user, f"{kind}:{path}")
        console.print(f"{user} holds no role at {kind}:{path} any more")

    add_member.__doc__ = f"Make a user a member of the {kind}, with a role."
    remove_member.__doc__ = f"Take away the role a user holds at the {kind}."


_unit_commands(org_app, "org", "unused for organizations")
_unit_commands(team_app, "team", "only the teams of this ORG")
_unit_commands(project_app, "project", "only the projects of this ORG/TEAM")


@user_app.command("create")
def user_create(name: str = typer.Argument(...), url: str | None = URL, token: str | None = TOKEN) -> None:
    """Create a user (then give roles with 'team add-member' or 'user role', and a token)."""
    client(url, token).create_user(name)
    console.print(f"created user {name}")


@user_app.command("list")
def user_list(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """List the users you may see, with their roles."""
    rows = client(url, token).users()
    if as_json:
        print_json(rows)
        return
    table(
        ["NAME", "ROLES", "CREATED"],
        [
            (
                u.name,
                ", ".join(f"{r.role}@{r.scope or 'cluster'}" for r in u.roles) or "-",
                u.created_at.strftime("%Y-%m-%d"),
            )
            for u in rows
        ],
    )


@user_app.command("delete")
def user_delete(name: str = typer.Argument(...), url: str | None = URL, token: str | None = TOKEN) -> None:
    """Delete a user with their roles and tokens."""
    client(url, token).remove_user(name)
    console.print(f"deleted user {name}")


@user_app.command("role")
def user_role(
    name: str = typer.Argument(...),
    role: str = typer.Argument(..., help="viewer, member, team-admin, org-admin, cluster-admin."),
    at: str = typer.Option("", "--at", help="Where: empty (the cluster), org:ORG or team:ORG/TEAM."),
    remove: bool = typer.Option(False, "--remove", help="Take away the role held there instead."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Give a user a role at the cluster, an org or a team (or take it away with --remove)."""
    admin = client(url, token)
    if remove:
        admin.unbind_role(name, at)
        console.print(f"{name} holds no role at {at or 'the cluster'} any more")
    else:
        admin.bind_role(name, role, at)
        console.print(f"{name} is {role} at {at or 'the cluster'}")


@user_app.command("whoami")
def whoami(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """Who the token in use belongs to, with its roles."""
    me = client(url, token).me()
    if as_json:
        print_json(me)
        return
    console.print(
        f"{me.name}: " + (", ".join(f"{r.role}@{r.scope or 'cluster'}" for r in me.roles) or "no role")
    )


@token_app.command("create")
def token_create(
    user: str = typer.Argument(...),
    name: str = typer.Argument(..., help="Where the token is used (a laptop, a CI job)."),
    expires_in: str = typer.Option(
        "", "--expires-in", help="How long it works: 3600, 15m, 12h, 30d (none: until revoked)."
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Create a token of a user for /api and ctl; the secret is shown once."""
    created = client(url, token).create_token(user, name, seconds(expires_in) if expires_in else None)
    until = created.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC") if created.expires_at else "revoked"
    console.print(
        f"created token {created.id} of {user} (works until {until}); the secret is shown only now:"
    )
    print(created.token)


@token_app.command("list")
def token_list(
    user: str = typer.Argument(...), url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON
) -> None:
    """List a user's tokens (never their secrets)."""
    rows = client(url, token).tokens(user)
    if as_json:
        print_json(rows)
        return
    stamp = "%Y-%m-%d %H:%M:%S"
    table(
        ["ID", "NAME", "PREFIX", "CREATED", "EXPIRES", "REVOKED"],
        [
            (
                t.id,
                t.name,
                t.prefix + "…",
                t.created_at.strftime(stamp),
                t.expires_at.strftime(stamp) if t.expires_at else "-",
                t.revoked_at.strftime(stamp) if t.revoked_at else "-",
            )
            for t in rows
        ],
    )


@token_app.command("revoke")
def token_revoke(
    token_id: str = typer.Argument(...), url: str | None = URL, token: str | None = TOKEN
) -> None:
    """Revoke a token at once."""
    client(url, token).revoke_token(token_id)
    console.print(f"revoked token {token_id}")
