"""The steps of onboarding, in order: each looks first, changes only what differs, and says which.

Every step returns one line for the operator, ``changed: ...`` or
``unchanged: ...`` (``ok: ...`` for the connection itself).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

from llmgw.errors import LlmgwError
from llmgw.operations.onboarding import ENGINE_GROUPS, ENGINE_USER, Onboarding, Plan, StepFailed, quote

CHANGES = {"install", "certificate", "config"}
"""Steps whose changes the running service only sees once restarted."""


def connect(ctx: Onboarding, plan: Plan) -> str:
    out = ctx.sh(
        "connect",
        "echo llmgw-ok; id -u; if [ -d /run/systemd/system ]; then echo systemd; else echo none; fi",
        "check that the machine runs a POSIX shell",
    ).split()
    if out[:1] != ["llmgw-ok"] or len(out) < 3:
        raise ctx.fail(
            "connect", f"unexpected answer {' '.join(out)!r}", "check the login shell of the SSH user"
        )
    if out[1] != "0":
        raise ctx.fail(
            "connect",
            f"logged in as uid {out[1]}, not root: creating users and services needs root",
            "log in as root (--user root) or as a user whose authorized key maps to root",
        )
    ctx.systemd = out[2] == "systemd"
    manager = "systemd" if ctx.systemd else "no systemd (PID 1 is something else): the service runs detached"
    return f"ok: reached {ctx.shell.where} as root; {manager}"


VERIFY_SCRIPT = """set -e; cd %(dir)s
command -v openssl >/dev/null || { echo 'openssl is not installed' >&2; exit 1; }
grep -Eq '^[0-9a-f]{64} [ *]'%(wheel)s'$' SHA256SUMS ||
  { echo 'the wheel is not listed in SHA256SUMS' >&2; exit 1; }
base64 -d SHA256SUMS.sig > SHA256SUMS.sig.raw 2>/dev/null ||
  { echo 'SHA256SUMS.sig is not base64' >&2; exit 1; }
openssl pkeyutl -verify -pubin -inkey %(trusted)s -rawin -in SHA256SUMS -sigfile SHA256SUMS.sig.raw \\
  >/dev/null 2>&1 ||
  { echo 'the signature of SHA256SUMS does not verify with '%(trusted)s >&2; exit 1; }
sha256sum --check --strict --quiet --ignore-missing SHA256SUMS >&2 ||
  { echo 'the wheel differs from its sha256 in SHA256SUMS' >&2; exit 1; }
"""
"""Checks a release on the machine itself, with nothing of llmgw: openssl and coreutils."""


def install(ctx: Onboarding, plan: Plan) -> str:
    release, layout = plan.release, ctx.layout
    ctx.write(layout.config_dir / "trusted.pub", release.trusted_pub)
    if ctx.read(layout.marker) == release.marker and ctx.read(layout.marker.parent / "bin/llmgw") is not None:
        return f"unchanged: llmgw {release.version} (wheel sha256 {release.sha256[:12]}) is installed"
    where = layout.releases(release.version)
    for name, data in release.files.items():
        ctx.write(where / name, data)
    script = VERIFY_SCRIPT % {
        "dir": quote(where),
        "wheel": quote(release.wheel),
        "trusted": quote(layout.config_dir / "trusted.pub"),
    }
    ctx.sh(
        "install",
        script,
        "the release was changed on its way or on the machine: nothing was installed; build or fetch it "
        "again and check it is signed by the key in the cluster's trusted.pub (apt-get install openssl "
        "if the machine lacks it)",
    )
    ctx.sh("install", _pip_script(ctx, f"{where}/{release.wheel}"), _pip_hint(ctx))
    ctx.write(layout.marker, release.marker)
    return f"changed: installed llmgw {release.version} into {layout.venv} (signature checked here and there)"


def _pip_script(ctx: Onboarding, wheel: str) -> str:
    venv, python, w = quote(ctx.layout.venv), quote(ctx.installer.python), quote(wheel)
    pip = f"{venv}/bin/python -m pip install --quiet --no-input --disable-pip-version-check"
    if not ctx.installer.installed_deps:
        return (
            f"set -e; [ -x {venv}/bin/python ] || {python} -m venv {venv}\n"
            f"{pip} {w}\n{pip} --no-deps --force-reinstall {w}\n"
        )
    return (
        f"set -e; [ -x {venv}/bin/python ] || {python} -m venv --system-site-packages {venv}\n"
        f"base=$({python} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\n"
        f"own=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\n"
        'echo "$base" > "$own/llmgw-installed-deps.pth"\n'
        f"{pip} --no-deps --force-reinstall {w}\n"
        f"{venv}/bin/python -c 'import llmgw.cli.main, llmgw.agent.running, llmgw.controlplane.running'\n"
    )


def _pip_hint(ctx: Onboarding) -> str:
    if ctx.installer.installed_deps:
        return f"install llmgw's dependencies into the environment of {ctx.installer.python} on the machine"
    return "check that the machine reaches its package index (pip's index-url) for llmgw's dependencies"


USER_SCRIPT = """set -e; u=%(user)s; did=''
for g in %(groups)s; do
  getent group $g >/dev/null || { groupadd --system $g; did="$did, group $g created"; }
done
if ! id -u "$u" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \\
    --groups %(group_list)s "$u"
  did="$did, user $u created in %(group_list)s"
else
  for g in %(groups)s; do
    id -nG "$u" | tr ' ' '\\n' | grep -qx $g || { usermod -aG $g "$u"; did="$did, $u joined $g"; }
  done
fi
echo "$did"
"""


def user(ctx: Onboarding, plan: Plan) -> str:
    script = USER_SCRIPT % {
        "user": ENGINE_USER,
        "groups": " ".join(ENGINE_GROUPS),
        "group_list": ",".join(ENGINE_GROUPS),
    }
    hint = "the engines' user needs groupadd, useradd and usermod (Debian's passwd package)"
    out = ctx.sh("user", script, hint).strip().lstrip(", ")
    if out:
        return f"changed: {out}"
    return f"unchanged: {ENGINE_USER} exists, in {', '.join(ENGINE_GROUPS)}"


def certificate(ctx: Onboarding, plan: Plan) -> str:
    current = ctx.read(ctx.layout.config_dir / plan.certificate)
    if current is not None and plan.certificate_fits(current):
        return f"unchanged: {plan.certificate} is the cluster's and current"
    for name, (data, mode) in plan.issue().items():
        ctx.write(ctx.layout.config_dir / name, data, mode)
    return f"changed: {'reissued' if current is not None else 'issued'} {plan.certificate}"


def config(ctx: Onboarding, plan: Plan) -> str:
    written = [
        name
        for name, (data, mode) in plan.files.items()
        if ctx.write(ctx.layout.config_dir / name, data, mode)
    ]
    names = ", ".join(plan.files)
    return f"changed: wrote {', '.join(written)}" if written else f"unchanged: {names} as they should be"


def service(ctx: Onboarding, plan: Plan) -> str:
    from llmgw.operations.services import start_detached, start_unit

    restart = bool(CHANGES & set(ctx.changed))
    return (start_unit if ctx.systemd else start_detached)(ctx, plan.service, restart)


def joined(ctx: Onboarding, plan: Plan) -> str:
    deadline = ctx.monotonic() + ctx.join_timeout_s
    last: Exception | None = None
    while True:
        try:
            if plan.joined():
                return f"ok: {plan.joined_what}"
        except (LlmgwError, OSError) as error:
            last = error
        if ctx.monotonic() >= deadline:
            break
        ctx.sleep(1.0)
    from llmgw.operations.services import log_hint

    why = f" (last answer: {last})" if last else ""
    raise ctx.fail(
        "join",
        f"not seen after {ctx.join_timeout_s:.0f} s: {plan.joined_what}{why}",
        "; ".join(filter(None, [plan.join_hint, log_hint(ctx, plan.service)])),
    )


Step = Callable[[Onboarding, Plan], str]
STEPS: list[tuple[str, Step, str]] = [
    ("connect", connect, "check the address, port and key"),
    ("install", install, "check the release and the machine's disk"),
    ("user", user, "check the machine's user database"),
    ("certificate", certificate, "check the cluster's CA"),
    ("config", config, "check the configuration directory on the machine"),
    ("service", service, "check the service's log on the machine"),
    ("join", joined, "check the service's log on the machine"),
]


def _check(check: Callable[[Onboarding], str]) -> Step:
    return lambda ctx, plan: check(ctx)


def free_bytes(ctx: Onboarding, path: PurePosixPath) -> int:
    """Bytes free for ``path`` on the machine (its nearest existing directory's file system)."""
    p = quote(path)
    out = ctx.sh(
        "connect",
        f'd={p}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done; df -Pk "$d" | tail -n 1',
        "check that df works on the machine",
    ).split()
    return int(out[3]) * 1024


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def room_check(
    step: str, path_of: Callable[[Onboarding], PurePosixPath], needed: int, what: str
) -> Callable[[Onboarding], str]:
    """A check that ``needed`` bytes fit under ``path_of(ctx)`` on the machine, for ``what``."""

    def check(ctx: Onboarding) -> str:
        path = path_of(ctx)
        free = free_bytes(ctx, path)
        if free < needed:
            raise ctx.fail(
                step,
                f"{what} needs {gib(needed)} under {path}; the machine has {gib(free)} free",
                f"free space there (or mount a larger disk at {path}), then run again: nothing was changed",
            )
        return f"ok: {gib(needed)} needed for {what}, {gib(free)} free under {path}"

    return check


def onboard(ctx: Onboarding, plan: Plan) -> list[str]:
    """Run every step in order, reporting each; the names of those that changed something."""
    changed = ctx.changed
    changed.clear()
    steps = [STEPS[0], *((name, _check(check), "") for name, check in plan.checks), *STEPS[1:]]
    for name, step, hint in steps:
        if name == "user" and not plan.engine_user:
            continue
        try:
            did = step(ctx, plan)
        except StepFailed:
            raise
        except LlmgwError as error:
            raise StepFailed(ctx.shell.where, name, error.message, error.hint or hint) from error
        if did.startswith("changed"):
            changed.append(name)
        ctx.report(name, did)
    return list(changed)
