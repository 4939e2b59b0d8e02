"""A throwaway PostgreSQL server for tests and benchmarks.

``PostgresServer`` makes a cluster in a temporary directory (``initdb``, trust
auth, ``fsync=off``: a test's data need not survive a power cut), starts it
with ``pg_ctl`` on a free port of 127.0.0.1, and stops it (and removes the
directory) on ``stop()``, on leaving its ``with`` block, or at exit. The
binaries are found through ``pg_config --bindir``, then
``/usr/lib/postgresql/*/bin`` (Debian's ``postgresql``), then PATH. PostgreSQL
refuses to run as root: as root the server runs as the ``postgres`` user
(``runuser -u postgres --``), its directory owned by that user.

``PHASEGATE_POSTGRES_URL`` names a server already running (CI starts one for
its whole run); ``server_url()`` prefers it. ``fresh_schema`` gives each test a
schema of its own on one server: a URL whose connections have it first on
their ``search_path``. ``own_database`` gives a test session (an xdist worker)
a database of its own on that server, since NOTIFY crosses schemas.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "PostgresServer",
    "PostgresUnavailable",
    "drop_database",
    "drop_schema",
    "find_bindir",
    "fresh_schema",
    "own_database",
    "server_url",
]

#: Seconds ``pg_ctl`` may take to start or stop the server.
START_TIMEOUT_S = 60


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be found or started; the message says why."""


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            candidates.append(done.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for directory in candidates:
        if all((Path(directory) / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return Path(directory)
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One cluster of our own: ``url`` is its superuser's URL (no password, trust
    auth on 127.0.0.1). ``start()`` may follow ``stop(remove=False)``: the same
    data and port, as a server restarted under its clients.

    Raises PostgresUnavailable from ``start()`` when the binaries are missing or
    the server does not come up (the message carries its log's tail).
    """

    def __init__(self, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.root: Path | None = None
        self.port = 0
        self.user = "postgres" if os.geteuid() == 0 else (os.environ.get("USER") or "postgres")
        self._atexit = False

    @property
    def url(self) -> str:
        return f"postgresql://{quote(self.user)}@127.0.0.1:{self.port}/postgres"

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def log(self) -> Path:
        assert self.root is not None
        return self.root / "server.log"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.bindir is not None
        command = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S
        )

    def start(self) -> PostgresServer:
        if self.bindir is None:
            raise PostgresUnavailable(
                "no PostgreSQL binaries (initdb, pg_ctl): install Debian's postgresql, "
                "or set PHASEGATE_POSTGRES_URL to a running server"
            )
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="phasegate-pg-"))
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
            done = self._run(
                "initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8",
                "--no-instructions", "--no-sync",
            )  # fmt: skip
            if done.returncode != 0:
                raise PostgresUnavailable(f"initdb failed: {done.stderr.strip()[-2000:]}")
            self.port = _free_port()
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200"
        )
        done = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
            "-t", str(START_TIMEOUT_S), "start",
        )  # fmt: skip
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else done.stderr
            raise PostgresUnavailable(f"pg_ctl start failed: {tail.strip()}")
        return self

    def stop(self, *, remove: bool = True, mode: str = "fast") -> None:
        """Stop the server (``mode``: fast, immediate); with ``remove`` delete its data."""
        if self.root is None:
            return
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def server_url() -> tuple[str, PostgresServer | None]:
    """A superuser URL of a server to test on: ``PHASEGATE_POSTGRES_URL`` (no server
    of ours: None), else a ``PostgresServer`` started here (returned, to stop).
    Raises PostgresUnavailable."""
    given = os.environ.get("PHASEGATE_POSTGRES_URL")
    if given:
        return given, None
    server = PostgresServer().start()
    return server.url, server


def _admin(url: str):  # noqa: ANN202 - a psycopg connection, imported lazily
    import psycopg
    import sqlalchemy as sa

    u = sa.engine.make_url(url.replace("postgres://", "postgresql://", 1))
    return psycopg.connect(
        host=u.host, port=u.port, user=u.username, password=u.password,
        dbname=u.database, autocommit=True, connect_timeout=10,
    )  # fmt: skip


def fresh_schema(url: str, name: str | None = None) -> tuple[str, str]:
    """Create an empty schema on the server at ``url``; returns (its name, a URL
    whose connections put it first on their ``search_path``)."""
    name = name or f"t_{uuid.uuid4().hex[:12]}"
    with _admin(url) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    sep = "&" if "?" in url else "?"
    return name, f"{url}{sep}options={quote(f'-csearch_path={name}')}"


def drop_schema(url: str, name: str) -> None:
    """Drop schema ``name`` and everything in it."""
    with _admin(url) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def own_database(url: str) -> str:
    """Create an empty database on the server at ``url`` (a superuser's); returns
    its URL. Its name is unique, so runs sharing the server never meet."""
    import sqlalchemy as sa

    name = f"phasegate_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{uuid.uuid4().hex[:8]}"
    with _admin(url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    """Drop the database ``url`` names, ending the connections still open to it
    (from the server's ``postgres`` database)."""
    import sqlalchemy as sa

    u = sa.engine.make_url(url)
    with _admin(u.set(database="postgres").render_as_string(hide_password=False)) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{u.database}" WITH (FORCE)')
