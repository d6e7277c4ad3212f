"""``llmgw agent``: run a node's agent."""

from __future__ import annotations

from pathlib import Path

import typer

from llmgw.agent.config import load_agent_config
from llmgw.cli.output import setup_logging
from llmgw.cli.server import _run

app = typer.Typer(help="Run a node's agent.", no_args_is_help=True)


@app.command()
def run(
    config: Path = typer.Option(Path("/etc/llmgw/agent.yaml"), "--config", "-c", help="agent.yaml."),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    log_json: bool = typer.Option(False, "--log-json", help="Log one JSON object per line."),
    keep_engines: bool = typer.Option(
        False,
        "--keep-engines",
        help="Leave the engines running when stopped (the next agent adopts them): what the "
        "llmgw-agent unit runs, so 'systemctl restart llmgw-agent' costs no replica.",
    ),
) -> None:
    """Run the agent until SIGINT or SIGTERM: register, start engines, report.

    The agent starts itself again (the same command, engines serving) on new
    settings from the control plane, on an edited agent.yaml that loads, and
    on 'llmgw restart'.
    """
    setup_logging(log_level, log_json)
    load_agent_config(config)
    from llmgw.agent.running import run_until_signalled

    _run(run_until_signalled(config, keep_engines=keep_engines))
