"""``llmgw ctl key``: API keys for ``/v1``; a secret is shown once, when its key is created."""

from __future__ import annotations

import typer

from llmgw.cli.options import AS_JSON, TOKEN, URL, client
from llmgw.cli.output import console, print_json, table

key_app = typer.Typer(help="API keys for /v1.", no_args_is_help=True)


@key_app.command("create")
def key_create(
    name: str = typer.Argument(..., help="A name for the key (who or what uses it)."),
    owner: str = typer.Option("", help="A label saying who uses the key."),
    project: str = typer.Option("", help="The project the key sits in (ORG/TEAM/PROJECT)."),
    user: str = typer.Option("", help="The user the key belongs to (instead of a project)."),
    collections: str = typer.Option(
        "",
        help="Knowledge collections its chat and Responses requests search when they name none "
        "(comma-separated).",
    ),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Create an API key in a project or for a user (it sees public models and those owned there
    or above); the secret is shown once."""
    if project and user:
        raise typer.BadParameter(
            "a key sits in a project or with a user, not both", param_hint="--project/--user"
        )
    place = f"project:{project}" if project else f"user:{user}" if user else ""
    names = [c.strip() for c in collections.split(",") if c.strip()]
    created = client(url, token).create_key(name, owner, place, names)
    console.print(f"created key {created.id} ({created.name}); the secret is shown only now:")
    print(created.key)


@key_app.command("list")
def key_list(url: str | None = URL, token: str | None = TOKEN, as_json: bool = AS_JSON) -> None:
    """List API keys (never their secrets)."""
    rows = client(url, token).keys()
    if as_json:
        print_json(rows)
        return
    table(
        ["ID", "NAME", "PREFIX", "PLACE", "OWNER", "CREATED", "REVOKED"],
        [
            (
                k.id,
                k.name,
                k.prefix + "…",
                k.place or "-",
                k.owner or "-",
                k.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                k.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if k.revoked_at else "-",
            )
            for k in rows
        ],
    )


@key_app.command("revoke")
def key_revoke(
    key: str = typer.Argument(..., help="The key's id or name."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Revoke an API key at once."""
    client(url, token).revoke_key(key)
    console.print(f"revoked key {key}")
