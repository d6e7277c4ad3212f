"""``llmgw ctl context``: the client config's contexts, so ``ctl`` reaches a cluster without flags.

A context names a control plane's URL and its admin token (inline, or a file
holding it); the current one is used when neither flags nor the environment
say where to go (:mod:`llmgw.client.targets`).
"""

from __future__ import annotations

from pathlib import Path

import typer

from llmgw.cli.options import AS_JSON
from llmgw.cli.output import console, print_json, table
from llmgw.client.config import ClientConfig, Context, load_client_config, save_client_config
from llmgw.client.paths import client_config_path
from llmgw.errors import NotFound, ValidationFailed

context_app = typer.Typer(
    help="Named control planes (URL and admin token) in ~/.config/llmgw/config.yaml "
    "($LLMGW_CLIENT_CONFIG); the current one is used when --url/--token and $LLMGW_URL are not given.",
    no_args_is_help=True,
)


def _load() -> tuple[ClientConfig, Path]:
    path = client_config_path()
    return load_client_config(path), path


@context_app.command("list")
def context_list(as_json: bool = AS_JSON) -> None:
    """Every context, the current one marked; never a token."""
    config, path = _load()
    rows = [
        {
            "name": c.name,
            "url": c.url,
            "token": "file " + c.token_file if c.token_file else ("inline" if c.token else "none"),
            "current": c.name == config.current_context,
        }
        for c in config.contexts
    ]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(
            f"no contexts in {path}; add one with 'llmgw ctl context set NAME --url URL --token-file FILE'"
        )
        return
    table(
        ["CURRENT", "NAME", "URL", "TOKEN"],
        [("*" if r["current"] else "", r["name"], r["url"], r["token"]) for r in rows],
    )


@context_app.command("use")
def context_use(name: str = typer.Argument(..., help="The context to make current.")) -> None:
    """Make a context the current one."""
    config, path = _load()
    if config.find(name) is None:
        known = ", ".join(c.name for c in config.contexts) or "none"
        raise NotFound(
            f"no context {name!r} (known: {known})", "add it with 'llmgw ctl context set NAME --url URL'"
        )
    config.current_context = name
    save_client_config(config, path)
    console.print(f"now using context {name}")


@context_app.command("set")
def context_set(
    name: str = typer.Argument(..., help="The context's name, e.g. prod."),
    url: str = typer.Option(None, "--url", help="The control plane's URL (kept if the context exists)."),
    token: str = typer.Option(None, "--token", help="The admin token, kept in the file itself."),
    token_file: Path = typer.Option(None, "--token-file", help="A file holding the admin token."),
    use: bool = typer.Option(False, "--use", help="Make it the current context too."),
) -> None:
    """Add a context or change one; the first context added becomes the current one."""
    if token is not None and token_file is not None:
        raise ValidationFailed([("--token", "give --token or --token-file, not both")], "see --help")
    config, path = _load()
    old = config.find(name)
    if url is None and old is None:
        raise ValidationFailed([("--url", "required for a new context")], "give the control plane's URL")
    kept = old if old is not None and token is None and token_file is None else None
    kept_file = kept.token_file if kept else ""
    context = Context(
        name=name,
        url=url or (old.url if old else ""),
        token=token or (kept.token if kept else ""),
        token_file=str(token_file.expanduser().resolve()) if token_file else kept_file,
    )
    config.put(context)
    if use or not config.current_context:
        config.current_context = name
    save_client_config(config, path)
    current = " (current)" if config.current_context == name else ""
    console.print(f"context {name}{current}: {context.url}, written to {path}")


@context_app.command("remove")
def context_remove(name: str = typer.Argument(..., help="The context to remove.")) -> None:
    """Remove a context (if it was the current one, none is current after)."""
    config, path = _load()
    config.remove(name)
    save_client_config(config, path)
    console.print(f"removed context {name}")
