"""``llmgw restart``: every agent, then the other control planes, then the leader, one at a time.

The command finds the leader (``/api/status``) and asks it directly
(``POST /api/cluster/restart``, answered once every agent and every other
control plane is back), then waits for the leader itself to come back: its
``/healthz`` answers with a new instance. ``--agents-only`` restarts the
agents alone, as before.
"""

from __future__ import annotations

import json
import time
import urllib.request

import typer

from llmgw.cli.options import TOKEN, URL, client
from llmgw.cli.output import console
from llmgw.client.admin import AdminClient
from llmgw.errors import LlmgwError

WAIT_S = 600.0
"""How long the whole restart may take before the command gives up waiting (it goes on regardless)."""

BACK_S = 120.0
"""How long the leader has to come back once it answered."""


def restart(
    reason: str = typer.Option("llmgw restart", help="Why, for the logs and the audit."),
    agents_only: bool = typer.Option(False, "--agents-only", help="Restart the agents alone."),
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Restart every process of the cluster, one at a time, with no request failing.

    First every connected agent over its stream (engines keep serving and are
    adopted), then every other control plane, then the leader, each waited for
    before the next. A control plane stops cleanly (handing leadership off if it
    leads) and starts its own command again in the same process, keeping its
    HTTP socket, so clients connecting meanwhile wait instead of being refused.
    """
    admin = client(url, token)
    if agents_only:
        restarted = admin.restart_agents(reason).restarted
        console.print(f"asked {len(restarted)} agents to restart: {', '.join(restarted) or 'none connected'}")
        return
    leader = AdminClient(_leader_url(admin), admin.token, timeout_s=WAIT_S)
    before = _instance(leader.url)
    console.print(f"restarting the cluster through the leader at {leader.url}…")
    answer = leader.request("POST", "/api/cluster/restart", {"reason": reason})
    for step in answer["restarted"]:
        console.print(f"  {step['kind']} {step['name']}: back after {step['seconds']:.1f} s")
    console.print(f"  control plane {answer['then']}: restarting…")
    deadline = time.monotonic() + BACK_S
    while _instance(leader.url) in ("", before):
        if time.monotonic() > deadline:
            raise LlmgwError(
                f"control plane {answer['then']} did not come back at {leader.url} within {BACK_S:g} s",
                "see its log; it stopped cleanly and should have started its own command again",
            )
        time.sleep(0.25)
    console.print(f"[bold green]every process restarted[/] ({len(answer['restarted']) + 1} in all)")


def _leader_url(admin: AdminClient) -> str:
    """The leader's own HTTP address, from the status any control plane answers (the one given if none)."""
    status = admin.get("/api/status")
    leader = next((p for p in status.get("control_planes", []) if p.get("role") == "leader"), None)
    return str(leader["http"]) if leader and leader.get("http") else admin.url


def _instance(url: str) -> str:
    """The instance a control plane's /healthz answers ("" while it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as answer:
            return str(json.load(answer).get("instance", ""))
    except (OSError, ValueError):
        return ""
