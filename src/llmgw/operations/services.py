"""Starting an llmgw service on the machine being onboarded: its systemd unit, or a detached process.

Where systemd is PID 1 the service gets the unit ``llmgw service install``
writes (deploy/systemd: ``KillMode=process`` and ``--keep-engines``, so
engines outlive a restart of their agent, as they do without systemd; the
control plane as its own user) and is enabled and started. Where it is not (containers, the
tests' machine), the service is started detached (``setsid``, output to
``<state>/<name>.log``) and its pid kept in ``<state>/<name>.pid``; a later
run finds it by that pid and its command line, so it never signals a
process that merely reuses the pid. Either way a run whose install,
certificate or configuration changed restarts the service.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from llmgw.operations.onboarding import Onboarding, Service, quote
from llmgw.operations.units import SERVICE_USER, UnitPaths, render_unit


def unit_text(ctx: Onboarding, service: Service) -> bytes:
    """The same unit ``llmgw service install`` writes (deploy/systemd), for the machine's paths."""
    paths = UnitPaths(
        executable=str(ctx.layout.llmgw),
        config_dir=str(ctx.layout.config_dir),
        state_dir=str(ctx.layout.state_dir),
    )
    return render_unit(role_of(service), paths).encode()


def role_of(service: Service) -> str:
    """``server`` or ``agent``: the unit's role (``llmgw-agent`` → ``agent``)."""
    return service.name.removeprefix("llmgw-")


def unit_path(ctx: Onboarding, service: Service) -> PurePosixPath:
    return ctx.layout.root / "etc/systemd/system" / f"{service.name}.service"


def start_unit(ctx: Onboarding, service: Service, restart: bool) -> str:
    name = quote(f"{service.name}.service")
    hint = f"read 'systemctl status {service.name}' and 'journalctl -u {service.name}' on the machine"
    if role_of(service) == "server":
        # The control plane's unit runs as its own user, owning its configuration and state.
        layout = ctx.layout
        ctx.sh(
            "service",
            f"id -u {SERVICE_USER} >/dev/null 2>&1 || useradd --system --user-group --no-create-home "
            f"--home-dir {quote(str(layout.state_dir))} --shell /usr/sbin/nologin {SERVICE_USER}; "
            f"chown -R {SERVICE_USER}:{SERVICE_USER} "
            f"{quote(str(layout.config_dir))} {quote(str(layout.state_dir))}",
            hint,
        )
    wrote = ctx.write(unit_path(ctx, service), unit_text(ctx, service))
    if wrote:
        ctx.sh("service", "systemctl daemon-reload", hint)
    ctx.sh("service", f"systemctl enable --quiet {name}", hint)
    if restart or wrote:
        ctx.sh("service", f"systemctl restart {name}", hint)
        return f"changed: (re)started the {service.name} unit"
    active = ctx.shell.run(f"systemctl is-active --quiet {name}").returncode == 0
    if active:
        return f"unchanged: the {service.name} unit runs"
    ctx.sh("service", f"systemctl start {name}", hint)
    return f"changed: started the {service.name} unit"


def pid_file(ctx: Onboarding, service: Service) -> PurePosixPath:
    return ctx.layout.state_dir / f"{service.name}.pid"


def log_file(ctx: Onboarding, service: Service) -> PurePosixPath:
    return ctx.layout.state_dir / f"{service.name}.log"


DETACHED_SCRIPT = """set -e; pidf=%(pidf)s; log=%(log)s; restart=%(restart)s
mkdir -p %(state)s
p=""; [ -f "$pidf" ] && p=$(cat "$pidf")
if [ -n "$p" ] && [ -r /proc/$p/cmdline ] && tr "\\0" " " < /proc/$p/cmdline | grep -qF -- %(mark)s; then
  if [ "$restart" = 0 ]; then echo "running $p"; exit 0; fi
  kill -TERM "$p"; i=0
  while kill -0 "$p" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done
  kill -KILL "$p" 2>/dev/null || true; was="restarted"
else was="started"; fi
cd %(state)s
setsid %(command)s >> "$log" 2>&1 < /dev/null &
echo $! > "$pidf"; echo "$was $!"
"""
"""Starts the service detached unless the process in its pid file is it (same command line)."""


def start_detached(ctx: Onboarding, service: Service, restart: bool) -> str:
    script = DETACHED_SCRIPT % {
        "pidf": quote(pid_file(ctx, service)),
        "log": quote(log_file(ctx, service)),
        "restart": int(restart),
        "state": quote(ctx.layout.state_dir),
        "mark": quote(" ".join(service.arguments)),
        "command": " ".join(quote(part) for part in (str(ctx.layout.llmgw), *service.arguments)),
    }
    out = ctx.sh("service", script, log_hint(ctx, service)).split()
    if out[:1] == ["running"]:
        return (
            f"unchanged: {service.name} runs (pid {out[1]}; no systemd: detached, {pid_file(ctx, service)})"
        )
    return (
        f"changed: {out[0]} {service.name} (pid {out[1]}; no systemd: detached, log {log_file(ctx, service)})"
    )


def log_hint(ctx: Onboarding, service: Service) -> str:
    if ctx.systemd:
        return f"read 'journalctl -u {service.name}' on the machine"
    tail = ctx.shell.run(f"tail -n 15 {quote(log_file(ctx, service))} 2>/dev/null").text.strip()
    return f"read {log_file(ctx, service)} on the machine" + (f"; its last lines:\n{tail}" if tail else "")
