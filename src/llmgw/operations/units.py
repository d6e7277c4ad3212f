"""The systemd units of a machine of the cluster: ``llmgw-server`` and ``llmgw-agent`` (C10.1).

:func:`render_unit` writes a unit's text for this machine's paths (the
``llmgw`` executable, the configuration and state directories); the files in
``deploy/systemd/`` are the same text for the default paths. :class:`Systemd`
runs ``systemctl`` through a seam, and turns its failure to reach systemd
(a machine, or a container, not booted with systemd as PID 1) into an error
that says so.

Engines outlive ``systemctl restart llmgw-agent``: the agent's unit has
``KillMode=process``, so stopping it signals the agent's main process only
(the engines stay in its control group, where systemd leaves them), and it
runs the agent with ``--keep-engines``, so the agent leaves them running
instead of stopping them; the next agent adopts each by pid, start time and
command line (docs/operations.md, "Services").
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw.errors import LlmgwError

UNIT_DIR = "etc/systemd/system"
"""Where units are installed, under the root (``/`` on a real machine)."""

ROLES = ("server", "agent")

NOT_BOOTED = ("not been booted with systemd", "Failed to connect to bus", "Host is down")
"""What systemctl says when there is no systemd to ask (PID 1 is something else)."""


@dataclass(frozen=True, slots=True)
class UnitPaths:
    """Where this machine keeps llmgw."""

    executable: str = "/usr/local/bin/llmgw"
    config_dir: str = "/etc/llmgw"
    state_dir: str = "/var/lib/llmgw"


def unit_name(role: str) -> str:
    return f"llmgw-{role}.service"


SERVER = """\
# llmgw's control plane: /v1, /api, the portal, /metrics, and the agents' gRPC port.
# Written by 'llmgw service install'; docs/operations.md, "Services".
[Unit]
Description=llmgw control plane
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
User=llmgw
Group=llmgw
ExecStart={executable} server run --config {config_dir}/server.yaml
Restart=on-failure
RestartSec=2
TimeoutStopSec=60
LimitNOFILE=65536
StateDirectory=llmgw
# /run/llmgw/firewall holds each process's firewall part (the agent's too)
RuntimeDirectory=llmgw llmgw/firewall
RuntimeDirectoryPreserve=yes
# nft (llmgw's firewall table) and ports below 1024, without root
AmbientCapabilities=CAP_NET_ADMIN CAP_NET_BIND_SERVICE
CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_BIND_SERVICE
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths=-{state_dir} -{config_dir} -/run/llmgw
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""

AGENT = """\
# llmgw's agent: this node's engines. Written by 'llmgw service install';
# docs/operations.md, "Services".
[Unit]
Description=llmgw agent
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
# root: engines run as llmgw-engine (run_as), the firewall table needs nft
User=root
Group=root
ExecStart={executable} agent run --config {config_dir}/agent.yaml --keep-engines
Restart=on-failure
RestartSec=2
TimeoutStopSec=30
LimitNOFILE=65536
# Engines survive a restart: only the agent's main process is signalled, and
# --keep-engines leaves them running for the next agent to adopt.
KillMode=process
# Hardening that leaves the cards alone: no PrivateDevices, DevicePolicy or
# MemoryDenyWriteExecute (CUDA compiles kernels into writable, executable
# memory), no ProtectKernelModules (nvidia-modprobe loads the driver), no
# PrivateTmp (engines outlive the agent's namespace).
NoNewPrivileges=yes
ProtectSystem=full
ReadWritePaths={config_dir}
ProtectControlGroups=yes
RestrictSUIDSGID=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""

_TEMPLATES = {"server": SERVER, "agent": AGENT}


def render_unit(role: str, paths: UnitPaths) -> str:
    """The unit of ``role`` (server or agent) for ``paths``."""
    if role not in _TEMPLATES:
        raise LlmgwError(f"there is no llmgw unit {role!r}", hint="name server or agent")
    return _TEMPLATES[role].format(
        executable=paths.executable, config_dir=paths.config_dir, state_dir=paths.state_dir
    )


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], Completed]
"""Runs a command and gives back what it printed: the seam between llmgw and systemctl."""


def run_command(argv: Sequence[str]) -> Completed:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        return Completed(127, "", f"{argv[0]}: not found")
    return Completed(done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True, slots=True)
class UnitState:
    unit: str
    installed: bool
    active: str
    """systemd's ActiveState: active, inactive, failed, activating..."""
    sub: str
    enabled: str
    """UnitFileState: enabled, disabled..."""
    pid: int


class Systemd:
    """systemctl, through ``runner``; ``root``: act on the units under that directory only (offline)."""

    def __init__(self, runner: Runner = run_command, root: Path | None = None) -> None:
        self._run = runner
        self.root = root

    def systemctl(self, *args: str) -> Completed:
        prefix = ["systemctl"] if self.root is None else ["systemctl", f"--root={self.root}"]
        done = self._run([*prefix, *args])
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()
            if any(marker in said for marker in NOT_BOOTED):
                first = said.splitlines()[0]
                raise LlmgwError(
                    f"systemctl {' '.join(args)}: systemd is not running on this machine ({first})",
                    hint="llmgw's units need a machine booted with systemd as PID 1; here (a container, say) "
                    "run 'llmgw server run' and 'llmgw agent run --keep-engines' under your own supervisor",
                )
            if done.returncode == 127:
                raise LlmgwError(
                    "systemctl is not installed on this machine",
                    hint="install systemd (apt-get install systemd)",
                )
            raise LlmgwError(
                f"systemctl {' '.join(args)} failed: {said or f'exit code {done.returncode}'}",
                hint="see 'journalctl -u <unit>' and 'systemctl status <unit>'",
            )
        return done

    def command(self, *argv: str) -> Completed:
        """Another command of the machine (useradd, chown): an error naming it when it fails."""
        done = self._run(list(argv))
        if done.returncode != 0:
            raise LlmgwError(
                f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip() or done.returncode}",
                hint="run 'llmgw service install' as root",
            )
        return done

    def daemon_reload(self) -> None:
        if self.root is None:  # an offline root has no manager to reload
            self.systemctl("daemon-reload")

    def state(self, unit: str) -> UnitState:
        if self.root is not None:  # offline: only the unit files can be asked, not a running manager
            said = self._run(["systemctl", f"--root={self.root}", "is-enabled", unit]).stdout.strip()
            installed = (self.root / UNIT_DIR / unit).exists()
            return UnitState(unit, installed, "unknown (offline root)", "", said or "not-found", 0)
        done = self.systemctl("show", "--property=LoadState,ActiveState,SubState,UnitFileState,MainPID", unit)
        fields = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        return UnitState(
            unit=unit,
            installed=fields.get("LoadState", "") not in ("", "not-found"),
            active=fields.get("ActiveState", ""),
            sub=fields.get("SubState", ""),
            enabled=fields.get("UnitFileState", ""),
            pid=int(fields.get("MainPID", "0") or 0),
        )


SERVICE_USER = "llmgw"
"""The control plane's user, made by ``llmgw service install`` where missing."""


def install_units(
    roles: Sequence[str], paths: UnitPaths, root: Path, systemd: Systemd, user_exists: bool = True
) -> list[Path]:
    """Write the units of ``roles`` under ``root``, reload systemd and enable them; the files written.

    On the machine itself (``root`` is ``/``) the server's user is made when missing
    (``user_exists`` False) and given the configuration and state directories.
    """
    directory = root / UNIT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for role in roles:
        path = directory / unit_name(role)
        path.write_text(render_unit(role, paths))
        path.chmod(0o644)
        written.append(path)
    if "server" in roles and systemd.root is None:
        if not user_exists:
            systemd.command(
                "useradd", "--system", "--user-group", "--no-create-home",
                "--home-dir", paths.state_dir, "--shell", "/usr/sbin/nologin", SERVICE_USER,
            )  # fmt: skip
        for directory_path in (paths.config_dir, paths.state_dir):
            systemd.command("mkdir", "-p", directory_path)
            systemd.command("chown", "-R", f"{SERVICE_USER}:{SERVICE_USER}", directory_path)
    systemd.daemon_reload()
    systemd.systemctl("enable", *(unit_name(role) for role in roles))
    return written


ORDER = {"start": ROLES, "restart": ROLES, "stop": tuple(reversed(ROLES))}
"""The control plane starts first and stops last: an agent without one only waits."""


def act(action: str, roles: Sequence[str], systemd: Systemd) -> list[str]:
    """``systemctl <action>`` for each unit of ``roles`` in :data:`ORDER`; the units acted on."""
    units = [unit_name(role) for role in ORDER[action] if role in roles]
    for unit in units:
        systemd.systemctl(action, unit)
    return units


def installed_roles(root: Path) -> list[str]:
    """The roles whose unit is installed under ``root``."""
    return [role for role in ROLES if (root / UNIT_DIR / unit_name(role)).exists()]
