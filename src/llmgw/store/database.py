"""The store: one database (SQLite or PostgreSQL), migrated on open, bounded in time.

::

    store = await Store.open("sqlite+aiosqlite:///var/lib/llmgw/store.db")
    await store.models.add("smollm2", definition)
    await store.close()

Every call into the database runs under ``timeout_s``; errors of the drivers
(``OSError``, SQLAlchemy's ``DBAPIError``, timeouts) are translated here into
:class:`~llmgw.errors.StoreUnavailable` or :class:`~llmgw.errors.StoreError`,
so nothing above the store ever sees a driver's exception.

:meth:`Store.transact` runs one short transaction of core statements (a
kept response written on the request path) at the least cost the database
allows. aiosqlite hands every call of a transaction (cursor, execute, fetch,
commit) to its thread and back, and SQLAlchemy's async layer adds a greenlet
switch to each: measured, a session's ``SELECT 1`` costs 0.3 to 1 ms on two
cores. On a SQLite file the whole transaction is handed to the store's own
thread once instead, on a plain sqlite3 connection with the same pragmas
(its statements built once and bound each time: 0.1 to 0.25 ms for a kept
response, trims included); on PostgreSQL it runs on the async engine, where
asyncpg needs no thread.

PostgreSQL may fail over (Patroni): the URL then names every member with
``target_session_attrs=read-write`` and new connections go to the primary.
A connection that finds itself on a server that cannot take writes or is
shutting down counts as lost, which drops every pooled connection, so the
next ones go to the new primary; :meth:`Store.read` runs a read again, once,
on a fresh connection when the first one was lost under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import ORMExecuteState, Session

from llmgw.errors import ConfigError, LlmgwError, StoreError, StoreUnavailable
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.access import Executes
from llmgw.store.audit import AuditLog
from llmgw.store.batches import Batches
from llmgw.store.blobcopies import BlobCopies
from llmgw.store.blobs import Blobs
from llmgw.store.catalog import Catalog
from llmgw.store.files import ClientFiles
from llmgw.store.jobs import WorkflowJobs
from llmgw.store.keys import Keys
from llmgw.store.knowledge import KnowledgeStore
from llmgw.store.leaderstate import LeaderState
from llmgw.store.leases import Fence, check_fence
from llmgw.store.limits import StoredLimits
from llmgw.store.nodes import Nodes
from llmgw.store.replicas import Replicas
from llmgw.store.responses import Responses
from llmgw.store.secretbox import SecretBox
from llmgw.store.secretcheck import check_key
from llmgw.store.settings import StoredSettings
from llmgw.store.tenants import Tenants
from llmgw.store.training import TrainingJobs
from llmgw.store.users import Users
from llmgw.store.usertokens import UserTokens

log = logging.getLogger(__name__)

T = TypeVar("T")

MIGRATIONS = Path(__file__).with_name("migrations")
"""Alembic's script folder, shipped inside the package."""

MIGRATION_LOCK = 0x6C6C6D67
"""PostgreSQL advisory lock held while migrating, so control planes starting together take turns."""

ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
}
"""Plain URL schemes and the async driver llmgw uses for each."""

UNREACHABLE_HINT = "check that the database is running and reachable"

SQLITE_BUSY_SHARE = 0.8
"""Share of the timeout SQLite waits for another writer's lock: it gives up before the store's
timeout does, so a locked database is reported as such and no query is left running."""

REFUSED_STATES = {"28", "3D"}
"""SQLSTATE classes of a refused login: bad credentials, no such database."""

UNAVAILABLE_STATES = {"08", "53", "57"}
"""SQLSTATE classes of a database that cannot serve now: connection lost, out of resources, shutting down."""

LOST_STATES = {"25006", "57P01", "57P02", "57P03"}
"""SQLSTATEs that end a connection's use though it is still open: a server that does not take
writes (a primary demoted, or a replica), and one shutting down, crashed or starting up."""

NO_PRIMARY = "TargetServerAttributeNotMatched"
"""asyncpg's error when no host of the URL matches ``target_session_attrs`` (none is primary yet)."""

FAILOVER_HINT = (
    "check that the database is running and reachable; during a failover (Patroni) this lasts until a "
    "replica is promoted, and the store URL must name every member with target_session_attrs=read-write"
)


class Store:
    """The database behind a control plane, with one repository per kind of record."""

    def __init__(
        self,
        engine: AsyncEngine,
        url: URL,
        *,
        timeout_s: float,
        clock: Clock = SYSTEM_CLOCK,
        secrets: SecretBox | None = None,
    ) -> None:
        self.engine = engine
        self.url = url
        self.timeout_s = timeout_s
        self.clock = clock
        self.fence: Fence | None = None
        """Set by a control plane: every write then checks it still holds the lease (None: unfenced)."""
        self._sessions = async_sessionmaker(
            engine, expire_on_commit=False, sync_session_class=self._fenced_session_class()
        )
        self._closed = False
        self._thread: tuple[ThreadPoolExecutor, Engine] | None = None
        """The thread :meth:`transact` runs SQLite's transactions in, and its engine (made at first use)."""
        self.models = Catalog(self, secrets)
        self.replicas = Replicas(self, secrets)
        """Engine keys sealed with ``secrets`` (the cluster's store key) when given."""
        self.nodes = Nodes(self)
        self.keys = Keys(self)
        self.settings = StoredSettings(self)
        self.audit = AuditLog(self)
        self.blobs = Blobs(self)
        self.blob_copies = BlobCopies(self)
        self.tenants = Tenants(self)
        self.users = Users(self)
        self.tokens = UserTokens(self)
        self.limits = StoredLimits(self)
        self.training = TrainingJobs(self)
        self.knowledge = KnowledgeStore(self)
        self.batches = Batches(self)
        self.files = ClientFiles(self)
        self.jobs = WorkflowJobs(self)
        self.responses = Responses(self)
        self.leader_state = LeaderState(self)
        """Drains, roll surges and the agents' rollout under way: a new leader carries them on."""

    def _fenced_session_class(self) -> type[Session]:
        """Sessions that check :attr:`fence` before their first write, in the same transaction."""
        fenced: type[Session] = type("FencedSession", (Session,), {})

        def on_execute(state: ORMExecuteState) -> None:
            if self.fence is not None and (state.is_insert or state.is_update or state.is_delete):
                check_fence(state.session, self.fence)

        def on_flush(session: Session, context: Any, instances: Any) -> None:
            if self.fence is not None and (session.new or session.dirty or session.deleted):
                check_fence(session, self.fence)

        event.listen(fenced, "do_orm_execute", on_execute)
        event.listen(fenced, "before_flush", on_flush)
        return fenced

    @classmethod
    async def open(
        cls, url: str, *, timeout_s: float = 5.0, clock: Clock | None = None, secrets: SecretBox | None = None
    ) -> Store:
        """Connect to the database at ``url`` and migrate it to the newest schema.

        ``url`` is ``sqlite+aiosqlite:///path/to/store.db`` or
        ``postgresql+asyncpg://user:password@host/db``; ``sqlite://`` and
        ``postgresql://`` are read as those. The SQLite file's folder must exist; the file and its
        ``-wal``, ``-shm`` and ``-journal`` are the owner's alone (0600). ``secrets``: the cluster's
        store key (a control plane's), checked against the store and used to seal the engine keys;
        without it they are written as they are (tools and tests that start no engine).
        """
        parsed = _parse(url)
        if parsed.get_backend_name() == "sqlite":
            keep_owner_only(parsed.database)
        engine = _create_engine(parsed, timeout_s)
        store = cls(engine, parsed, timeout_s=timeout_s, clock=clock or SYSTEM_CLOCK, secrets=secrets)
        try:
            async with store.bounded(), _migration_lock(), engine.begin() as connection:
                await connection.run_sync(_migrate)
            if secrets is not None:
                await check_key(store, secrets)
                if sealed := await store.replicas.seal_plain():
                    log.info("sealed the engine keys of %d replicas stored before they were sealed", sealed)
        except BaseException:
            await engine.dispose()
            raise
        return store

    async def close(self) -> None:
        """Close every pooled connection; the store cannot be used afterwards."""
        self._closed = True
        if self._thread is not None:
            thread, engine = self._thread
            await asyncio.get_running_loop().run_in_executor(thread, engine.dispose)
            thread.shutdown(wait=True)
        await self.engine.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def where(self) -> str:
        """The database's URL without its password, for messages and logs."""
        return self.url.render_as_string(hide_password=True)

    def now(self) -> datetime:
        """The time the store stamps on records: the injected clock's wall time (the system's by default)."""
        return datetime.fromtimestamp(self.clock.time(), UTC)

    async def ping(self) -> None:
        """Check that the database answers; raises :class:`StoreUnavailable` when it does not."""
        async with self.session() as session:
            await session.execute(text("SELECT 1"))

    @asynccontextmanager
    async def bounded(self) -> AsyncIterator[None]:
        """Run the block under the store's timeout, translating driver errors."""
        if self._closed:
            raise StoreError(f"the store at {self.where} is closed", hint="open the store again")
        try:
            async with asyncio.timeout(self.timeout_s):
                yield
        except LlmgwError:
            raise
        except TimeoutError:
            raise StoreUnavailable(
                f"the store at {self.where} did not answer within {self.timeout_s:g} s", hint=self._hint()
            ) from None
        except OperationalError as error:
            if self.url.get_backend_name() == "sqlite" and "locked" in str(error.orig):
                raise StoreUnavailable(
                    f"the store at {self.where} stayed locked by another writer for "
                    f"{self.timeout_s * SQLITE_BUSY_SHARE:g} s",
                    hint="check that no other process holds the database open for writing",
                ) from error
            raise StoreUnavailable(
                f"the store at {self.where} cannot be reached: {_reason(error)}", hint=self._hint()
            ) from error
        except (OSError, InterfaceError) as error:
            if _error_name(error) == NO_PRIMARY:
                raise StoreUnavailable(
                    f"no server of the store at {self.where} takes writes now: {_reason(error)}",
                    hint=FAILOVER_HINT,
                ) from error
            raise StoreUnavailable(
                f"the store at {self.where} cannot be reached: {_reason(error)}", hint=self._hint()
            ) from error
        except DBAPIError as error:
            state = _sqlstate(error)
            if state[:2] in REFUSED_STATES:
                raise StoreUnavailable(
                    f"the store at {self.where} refused the connection: {_reason(error)}",
                    hint="check the user, password and database name in the store URL",
                ) from error
            if _error_name(error) == NO_PRIMARY:
                raise StoreUnavailable(
                    f"no server of the store at {self.where} takes writes now: {_reason(error)}",
                    hint=FAILOVER_HINT,
                ) from error
            if state in LOST_STATES:
                raise StoreUnavailable(
                    f"the store at {self.where} cannot take this statement now: {_reason(error)}",
                    hint=FAILOVER_HINT,
                ) from error
            if error.connection_invalidated or state[:2] in UNAVAILABLE_STATES:
                raise StoreUnavailable(
                    f"the store at {self.where} lost its connection: {_reason(error)}", hint=self._hint()
                ) from error
            raise StoreError(
                f"the store at {self.where} refused a statement: {_reason(error)}",
                hint="this is a bug in llmgw or a damaged database; report it with the log",
            ) from error
        except SQLAlchemyError as error:
            raise StoreError(
                f"the store at {self.where} failed: {_reason(error)}",
                hint="this is a bug in llmgw or a damaged database; report it with the log",
            ) from error

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session inside one transaction: committed when the block ends, rolled back on an error.

        The whole block, commit included, runs under the store's timeout.
        """
        async with self.bounded(), self._sessions.begin() as session:
            yield session

    async def read(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``work``, which only reads, in a session; once more on a fresh connection if the
        connection was lost under the first try (a failover, a server restarted), both within the
        store's one timeout."""
        async with self.bounded():
            try:
                async with self._sessions.begin() as session:
                    return await work(session)
            except (DBAPIError, OSError) as error:
                if not _lost(error):
                    raise
                log.info("the store lost a connection under a read, reading again: %s", _reason(error))
            async with self._sessions.begin() as session:
                return await work(session)

    async def transact(self, work: Callable[[Executes], T]) -> T:
        """Run ``work``, one short transaction of core statements, as a whole: committed when it
        returns, rolled back when it raises; under the store's timeout, its errors translated.

        On a SQLite file (and no :attr:`fence`) it runs in the store's own thread, handed there
        once; otherwise in a session (where the fence is checked), on the async engine."""
        async with self.bounded():
            thread = self._sqlite_thread() if self.fence is None else None
            if thread is not None:
                executor, engine = thread
                return await asyncio.get_running_loop().run_in_executor(
                    executor, _in_transaction, engine, work
                )
            async with self._sessions.begin() as session:
                return await session.run_sync(work)

    def _sqlite_thread(self) -> tuple[ThreadPoolExecutor, Engine] | None:
        """The thread and engine of SQLite transactions (None: not a SQLite file)."""
        if self._thread is None:
            database = self.url.database
            if self.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
                return None
            engine = create_engine(
                self.url.set(drivername="sqlite"),
                connect_args={"timeout": self.timeout_s * SQLITE_BUSY_SHARE, "check_same_thread": False},
            )
            event.listen(engine, "connect", _sqlite_pragmas(self.timeout_s))
            self._thread = (ThreadPoolExecutor(1, thread_name_prefix="llmgw-store"), engine)
        return self._thread

    def _hint(self) -> str:
        if self.url.get_backend_name() == "sqlite" and self.url.database:
            folder = Path(self.url.database).parent
            return f"check that the folder {folder} exists and is writable"
        return UNREACHABLE_HINT


def _in_transaction(engine: Engine, work: Callable[[Executes], T]) -> T:
    with engine.begin() as connection:
        return work(connection)


SQLITE_FILES = ("", "-wal", "-shm", "-journal")
"""A SQLite database's file and those SQLite keeps beside it (made with the database file's mode)."""


def keep_owner_only(database: str | None) -> None:
    """Make the SQLite file ``database`` (created when missing) and those beside it 0600."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    # Only a file not there yet is opened here: closing a descriptor of a file drops every POSIX lock
    # this process holds on it, SQLite's included, had another store of this process opened it.
    # A missing folder is the driver's error to report.
    with contextlib.suppress(FileNotFoundError, FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for suffix in SQLITE_FILES:
        try:
            os.chmod(f"{path}{suffix}", 0o600)
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("cannot make %s%s readable by its owner only: %s", path, suffix, error)


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(
            f"the store URL {url!r} cannot be read",
            hint="use sqlite+aiosqlite:///path/to/store.db or postgresql+asyncpg://user:pass@host/db",
        ) from None
    driver = ASYNC_DRIVERS.get(parsed.drivername)
    return parsed.set(drivername=driver) if driver else parsed


def _create_engine(url: URL, timeout_s: float) -> AsyncEngine:
    backend = url.get_backend_name()
    options: dict[str, Any] = {}
    if backend == "sqlite":
        options["connect_args"] = {"timeout": timeout_s * SQLITE_BUSY_SHARE}
    elif backend == "postgresql":
        options["connect_args"] = {"timeout": timeout_s, "command_timeout": timeout_s}
        options["pool_pre_ping"] = True
    else:
        raise ConfigError(
            f"the store does not support {backend!r} databases",
            hint="use sqlite+aiosqlite:///path/to/store.db or postgresql+asyncpg://user:pass@host/db",
        )
    try:
        engine = create_async_engine(url, **options)
    except (ArgumentError, NoSuchModuleError, ImportError, SQLAlchemyError) as error:
        raise ConfigError(
            f"the store URL {url.render_as_string(hide_password=True)} cannot be used: {error}",
            hint="use the drivers sqlite+aiosqlite or postgresql+asyncpg",
        ) from None
    if backend == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas(timeout_s))
    else:
        event.listen(engine.sync_engine, "handle_error", _count_lost_as_disconnects)
    return engine


def _count_lost_as_disconnects(context: ExceptionContext) -> None:
    """A server that stopped taking writes or is going away ends the connection's use like a
    disconnect: SQLAlchemy then drops it and every connection pooled before it."""
    if context.sqlalchemy_exception is None and context.original_exception is None:
        return
    if _state_of(context.original_exception) in LOST_STATES:
        context.is_disconnect = True


def _sqlite_pragmas(timeout_s: float) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(timeout_s * SQLITE_BUSY_SHARE * 1000)}")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    return on_connect


def _migration_lock() -> asyncio.Lock:
    """One migration at a time in this process: Alembic keeps its migration context in module globals."""
    loop = asyncio.get_running_loop()
    lock = _MIGRATION_LOCKS.get(loop)
    if lock is None:
        lock = _MIGRATION_LOCKS[loop] = asyncio.Lock()
    return lock


_MIGRATION_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _migrate(connection: Connection) -> None:
    """Migrate to the newest revision, holding the database's write lock so processes take turns."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    elif connection.dialect.name == "sqlite":
        # Takes the write lock now and makes SQLite's DDL part of this transaction.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _sqlstate(error: DBAPIError) -> str:
    """PostgreSQL's SQLSTATE of the error, or "" (SQLite has none)."""
    return _state_of(error.orig)


def _state_of(original: BaseException | None) -> str:
    """The SQLSTATE a driver's exception carries (asyncpg's own, or under SQLAlchemy's adapter), or ""."""
    state = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
    if state is None and original is not None:
        state = getattr(original.__cause__, "sqlstate", None)
    return str(state or "")


def _error_name(error: BaseException) -> str:
    """The class name of the driver's own exception under SQLAlchemy's wrappers."""
    original: BaseException | None = getattr(error, "orig", None) or error
    if original is not None and original.__cause__ is not None:
        original = original.__cause__
    return type(original).__name__


def _lost(error: BaseException) -> bool:
    """Whether ``error`` means the connection went away (so the same work may be tried on a fresh one)."""
    if isinstance(error, DBAPIError):
        return (
            bool(error.connection_invalidated)
            or _sqlstate(error)[:2] == "08"
            or _sqlstate(error) in LOST_STATES
        )
    return isinstance(error, OSError)


def _reason(error: BaseException) -> str:
    """The driver's own words, first line only, without SQLAlchemy's boilerplate."""
    original = getattr(error, "orig", None) or error
    words = str(original).strip().splitlines()
    return words[0] if words else type(original).__name__
