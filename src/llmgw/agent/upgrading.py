"""An agent upgrading itself when its control plane sends a release (``ctl upgrade agents``).

The release's files come from the mirror over the agent's own link, each
checked against its sha256 as it arrives; the signature of its SHA256SUMS is
checked against THIS node's trusted key (``release.trusted_pub``) before any
file is fetched, and every file against the sums before the wheel is handed to
the installer (pip in the agent's environment). Then the agent starts again on
the new version, its engines serving throughout and adopted by the next agent,
which registers with the new version. Whatever stops the upgrade (an unsigned
or altered release, a failed fetch or install) is logged and told to the
control plane (:class:`~llmgw.core.upgrades.UpgradeResult`); the agent keeps
running as it was.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from llmgw import __version__
from llmgw.core.upgrades import UpgradeAgent, UpgradeResult
from llmgw.errors import LlmgwError
from llmgw.mirror.fetching import BlobWriter
from llmgw.mirror.releases import SIGNATURE, SUMS, read_trusted_key, verify_release, verify_signed_sums
from llmgw.mirror.upgrades import WheelInstaller
from llmgw.runtime.files import write_public

log = logging.getLogger(__name__)

Fetch = Callable[[str, int], AsyncIterator[bytes]]
"""A blob's bytes from the control plane's mirror, from an offset."""

_VERSION = re.compile(r"^[0-9A-Za-z.+!_-]{1,64}$")


class AgentUpgrader:
    """Carries out UpgradeAgent: fetch, verify, install, start again; one upgrade at a time."""

    def __init__(
        self,
        work_dir: Path,
        trusted_pub: Path,
        fetcher: Callable[[], Fetch],
        installer: WheelInstaller,
        restart: Callable[[str], None],
        report: Callable[[UpgradeResult], None],
        running: str = __version__,
    ) -> None:
        self._work = work_dir / "upgrades"
        self._trusted_pub = trusted_pub
        self._fetcher = fetcher
        self._installer = installer
        self._restart = restart
        self._report = report
        self._running = running
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def handle(self, message: UpgradeAgent) -> None:
        """Start upgrading to ``message``'s release in the background (ignored while one is under way)."""
        if self.busy:
            log.info("upgrade to %s ignored: an upgrade is under way", message.version)
            return
        self._task = asyncio.create_task(self.upgrade(message), name=f"upgrade-{message.version}")

    async def upgrade(self, message: UpgradeAgent) -> None:
        """Upgrade to the release, or tell the control plane why not."""
        if message.version == self._running:
            log.info("asked to upgrade to %s, which runs already: nothing to do", message.version)
            return
        try:
            wheel = await self._obtain(message)
            log.info("installing llmgw %s from %s", message.version, wheel.name)
            await self._installer.install(wheel)
        except LlmgwError as error:
            log.error("refused the upgrade to %s: %s", message.version, error)
            self._report(UpgradeResult(version=message.version, error=str(error)))
            return
        self._restart(f"upgraded to llmgw {message.version}")

    async def _obtain(self, message: UpgradeAgent) -> Path:
        if not _VERSION.match(message.version):
            raise LlmgwError(
                f"{message.version!r} is not a version", hint="send a release made by 'make release'"
            )
        directory = self._work / message.version
        await asyncio.to_thread(_fresh, directory)
        key = await asyncio.to_thread(read_trusted_key, self._trusted_pub)
        write_public(directory / SUMS, message.sums.encode())
        write_public(directory / SIGNATURE, message.signature.encode())
        sums = await asyncio.to_thread(verify_signed_sums, directory, key)  # before fetching anything
        files = {f.filename: f for f in message.files}
        for name in sorted(set(sums) - {SUMS, SIGNATURE}):
            file = files.get(name)
            if file is None or file.sha256 != sums[name]:
                raise LlmgwError(
                    f"the control plane sent no file {name} with the sha256 SHA256SUMS gives it",
                    hint="put the whole release into the mirror: 'llmgw ctl upgrade agents --release DIR'",
                )
            await self._fetch(file.sha256, file.size, directory / name)
        release = await asyncio.to_thread(verify_release, directory, key)
        if release.version != message.version:
            raise LlmgwError(
                f"the release holds llmgw {release.version}, not the {message.version} it was sent as",
                hint="send the release again with 'llmgw ctl upgrade agents --release DIR'",
            )
        return release.wheel

    async def _fetch(self, sha256: str, size: int, dest: Path) -> None:
        fetch = self._fetcher()
        writer = BlobWriter(dest, sha256, size)
        offset = await writer.start()
        try:
            async for chunk in fetch(sha256, offset):
                await writer.write(chunk)
            await writer.finish()
        except BaseException:
            await writer.discard()
            raise


def _fresh(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
