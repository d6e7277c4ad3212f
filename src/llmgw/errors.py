"""Every error llmgw raises on purpose, in one hierarchy.

::

    LlmgwError                      what was wrong + what to do (``hint``)
    ├── ConfigError                 a config file or flag that cannot be used
    ├── ValidationFailed            user input with field-level problems (400)
    ├── NotFound                    a named thing that does not exist (404)
    ├── Conflict                    a thing that already exists, or is still in use (409)
    ├── Unauthorized                a missing or wrong credential (401)
    ├── Forbidden                   a credential whose roles do not allow the action (403)
    ├── TooLarge                    more bytes than a bound or quota allows (413)
    ├── StoreError                  the database failed or timed out
    │   └── StoreUnavailable        the database cannot be reached (503)
    ├── EngineError                 an inference engine failed
    │   ├── BuildError              no engine build could be installed
    │   │   └── BuildCheckInconclusive  a build's check could not tell whether it computes
    │   └── EngineUnhealthy         an engine did not become healthy
    ├── ChecksumMismatch            downloaded bytes differ from their sha256
    ├── DownloadError               a download failed
    ├── UntrustedRelease            a release unsigned, badly signed or altered
    ├── NoCapacity                  no node can take a replica
    ├── StorageFull                 a disk llmgw writes to is full (507)
    ├── ChannelClosed               the agent stream ended
    └── NotLeader                   this control plane does not hold the lease (503)

Errors of grpc, aiohttp and the database drivers are translated into these
at the boundary where they are caught; a user never sees a raw driver error.
"""

from __future__ import annotations


class LlmgwError(Exception):
    """Base of llmgw's errors: ``str()`` says what was wrong, ``hint`` what to do."""

    status = 500

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(LlmgwError):
    status = 400


class ValidationFailed(LlmgwError):
    """Input with one or more problems, each naming its field."""

    status = 400

    def __init__(self, problems: list[tuple[str, str]], hint: str = "") -> None:
        self.problems = problems
        text = "; ".join(f"{field}: {why}" if field else why for field, why in problems)
        super().__init__(f"invalid input: {text}", hint)


class NotFound(LlmgwError):
    status = 404


class Conflict(LlmgwError):
    status = 409


class BadRequest(LlmgwError):
    status = 400


class Unauthorized(LlmgwError):
    status = 401


class Forbidden(LlmgwError):
    status = 403


class TooLarge(LlmgwError):
    """An upload past a size bound or its owner's quota; nothing of it is kept."""

    status = 413


class StoreError(LlmgwError):
    status = 500


class StoreUnavailable(StoreError):
    status = 503


class EngineError(LlmgwError):
    pass


class BuildError(EngineError):
    pass


class BuildCheckInconclusive(BuildError):
    """The check of a build said nothing about the build (a card's memory was full): nothing is
    recorded, and the install stops rather than settle for a worse build."""


class EngineUnhealthy(EngineError):
    pass


class ChecksumMismatch(LlmgwError):
    pass


class DownloadError(LlmgwError):
    pass


class UntrustedRelease(LlmgwError):
    """A release (or bundle) whose signature is missing or wrong, or whose files differ from their sums."""

    status = 400


class NoCapacity(LlmgwError):
    status = 503


class StorageFull(LlmgwError):
    """A disk llmgw writes to (the mirror, a node's weights) is full; nothing half-written is kept."""

    status = 507


class ChannelClosed(LlmgwError):
    pass


class NotLeader(LlmgwError):
    """This control plane does not hold the leader lease (or no longer does)."""

    status = 503
