"""Shared fixtures: real git repositories, a real SQLite file, a real PostgreSQL
server, the real CLI."""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store.tables import metadata
from phasegate.testing.model_server import ScriptedModelServer, Step

from support.github_model import User
from support.github_server import GitHubServer
from support.postgres import (
    PostgresServer,
    PostgresUnavailable,
    drop_database,
    drop_schema,
    find_bindir,
    fresh_schema,
    own_database,
    server_url,
)
from support.prism import PrismError, PrismProxy, find_description, find_prism

# The width every command prints at, in its own process or in this one
# (``phasegate_in_process``): rich reads it once, when phasegate's consoles are made.
os.environ["COLUMNS"] = "200"
# The rig (tests/support) is imported by the subprocesses some tests start too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p
)

ROLES = ("plan", "plan_review", "build", "review", "verification")

#: How many xdist workers ``-n auto`` (pyproject's addopts) starts per core. Most
#: tests wait on subprocesses (git, the agent CLIs, workers, servers), so twice as
#: many workers as cores keeps the cores busy; PYTEST_XDIST_AUTO_NUM_WORKERS overrides.
WORKERS_PER_CORE = 2

#: The server the controller of an xdist run started for all its workers (stopped at the end).
_RUN_POSTGRES = pytest.StashKey[PostgresServer]()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: WORKERS_PER_CORE per core this process may run on, or
    PYTEST_XDIST_AUTO_NUM_WORKERS when set (xdist's own override, kept)."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if given:
        return int(given)
    return WORKERS_PER_CORE * len(os.sched_getaffinity(0))


def pytest_configure(config: pytest.Config) -> None:
    # One PostgreSQL server for the whole run, each test on a schema of its own: the
    # controller of an xdist run starts it before its workers (which inherit the
    # environment) unless PHASEGATE_POSTGRES_URL names one already. A run without
    # workers starts its own lazily (postgres_server_url). Missing binaries or a
    # server that does not start are left to the fixture, which says why.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", 0):
        return
    if os.environ.get("PHASEGATE_POSTGRES_URL") or find_bindir() is None:
        return
    try:
        server = PostgresServer().start()
    except PostgresUnavailable:
        return
    config.stash[_RUN_POSTGRES] = server
    os.environ["PHASEGATE_POSTGRES_URL"] = server.url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under xdist (each worker collects; the controller hands out in that order) the
    # slow end-to-end tests go out first: the quick ones then fill the workers' gaps
    # at the end, instead of one real-CLI run starting last and holding up the run.
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_RUN_POSTGRES, None)
    if server is not None:
        os.environ.pop("PHASEGATE_POSTGRES_URL", None)
        server.stop()


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Tests must not depend on (or write to) the machine's git configuration.
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "test")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "test@localhost")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "test")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "test@localhost")


@pytest.fixture(autouse=True)
def _unconfined_unless_sandboxed(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # Most tests watch their agents from outside (pid files, markers in tmp_path),
    # which the sandbox forbids; the sandbox itself, and every real-CLI test, run
    # confined (pytest.mark.sandboxed): the default of a person's machine.
    if request.node.get_closest_marker("sandboxed") is None:
        monkeypatch.setenv("PHASEGATE_SANDBOX", "none")
    else:
        monkeypatch.delenv("PHASEGATE_SANDBOX", raising=False)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def branch_with_change(checkout: Path, branch: str, text: str = "x = 2\n") -> str:
    """A commit on a new ``branch`` of ``checkout`` changing app.py; its SHA."""
    git(checkout, "checkout", "-q", "-b", branch)
    (checkout / "app.py").write_text(text)
    git(checkout, "commit", "-qam", f"change on {branch}")
    sha = git(checkout, "rev-parse", "HEAD")
    git(checkout, "checkout", "-q", "main")
    return sha


ROOT = Path(__file__).resolve().parent.parent


def agent_cli(name: str) -> str:
    """The path of a real agent CLI (claude, codex, mini): ``PHASEGATE_<NAME>_BIN``,
    the copy .ci/run installs under .ci/node (npm), .ci/mswe or .ci/<name> (a venv),
    or PATH.
    Missing, it fails the test in CI (where .ci/run must have installed it) and
    skips it elsewhere."""
    candidates = [
        os.environ.get(f"PHASEGATE_{name.upper()}_BIN", ""),
        str(ROOT / ".ci" / "node" / "node_modules" / ".bin" / name),
        str(ROOT / ".ci" / "mswe" / "bin" / name),
        str(ROOT / ".ci" / name / "bin" / name),  # a venv of its own: .ci/aider
        shutil.which(name) or "",
    ]
    found = next((c for c in candidates if c and Path(c).exists()), None)
    if found is None:
        message = f"the {name} CLI is not installed (bash .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


# -- the two databases: one conformance suite on both ---------------------------------


def postgres_required() -> bool:
    """CI sets PHASEGATE_POSTGRES=required: a server that does not start fails the
    PostgreSQL tests there; elsewhere they are skipped with the reason."""
    return os.environ.get("PHASEGATE_POSTGRES") == "required"


def no_postgres(reason: str) -> None:
    """Fail (CI) or skip (elsewhere) a test that needs PostgreSQL, saying why."""
    if postgres_required():
        pytest.fail(f"PHASEGATE_POSTGRES=required: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A superuser URL of a database of this session's own (this xdist worker's) on
    the run's PostgreSQL: PHASEGATE_POSTGRES_URL, or a throwaway server started
    here (support.postgres), stopped at the end. NOTIFY reaches every LISTEN of a
    database whatever its schema, so sessions running side by side on one server
    get a database each: a test that waits for no wake-up hears no other test's."""
    try:
        url, server = server_url()
        url = own_database(url)
        drop_schema(url, fresh_schema(url)[0])  # it answers, and lets us make schemas
    except (PostgresUnavailable, psycopg.OperationalError) as exc:
        no_postgres(f"no PostgreSQL to test on: {' '.join(str(exc).split())}")
    yield url
    drop_database(url)
    if server is not None:
        server.stop()


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of this test's own, to stop and start again (the session's is shared)."""
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        no_postgres(str(exc))
    yield server
    server.stop()


@pytest.fixture
def pg_url(postgres_server_url: str) -> Iterator[str]:
    """A ``store.url`` on the session's server with a schema of this test's own
    (empty; dropped afterwards). Measured here: a schema, migrated, then dropped,
    127 ms median; a database made from a migrated template, then dropped, 449 ms."""
    name, url = fresh_schema(postgres_server_url)
    yield url
    drop_schema(postgres_server_url, name)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The conformance suite's store URL: a SQLite file, then a PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return str(request.getfixturevalue("pg_url"))


def on_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


#: What a store reports when another transaction's lock outlasted its busy timeout.
LOCKED = r"database is locked|lock not available"


@contextmanager
def writes_held(url: str) -> Iterator[None]:
    """Another connection holding what every write of the store at ``url`` waits for,
    reads left free: SQLite's write lock (``BEGIN IMMEDIATE`` and a write), on
    PostgreSQL every phasegate table locked ``IN EXCLUSIVE MODE`` (which only
    ``ACCESS SHARE``, a plain read, gets past)."""
    if on_sqlite(url):
        other = sqlite3.connect(sa.engine.make_url(url).database or "", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE workflows SET title = title")
        try:
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()
        return
    with psycopg.connect(url) as pg:  # a transaction, rolled back on leaving with an error
        pg.execute(f"LOCK TABLE {', '.join(metadata.tables)} IN EXCLUSIVE MODE")
        yield
        pg.rollback()


def new_workflow(store: Store) -> str:
    """A workflow row with made-up fields, for tests of the store alone."""
    return store.create_workflow(
        title="t",
        ticket="x",
        repo_path="/r",
        base_branch="main",
        auto_merge=False,
        content_language="en",
    )


def land_held(engine: Engine, row: Mapping[str, object], *names: str) -> dict[str, object]:
    """A workflow the merge gate held for the violations ``names`` (and nothing
    else), approved by a person and advanced to its end: the row it ends with."""
    assert row["status"] == "waiting", row
    hold = row["state"]["merge_hold"]  # type: ignore[index]
    assert hold is not None and hold["protected"] == [], hold
    assert sorted({v["name"] for v in hold["violations"]}) == sorted(set(names)), hold
    workflow_id = str(row["id"])
    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "a person"))
    return engine.advance(workflow_id)


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A git repository on ``main`` with one commit of ``files``."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in (files or {"README.md": "# sample\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(content)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def scripted_cartridge(
    answers_file: str = "answers.toml",
    *,
    checks: list[str] | None = None,
    extra: str = "",
    role_overrides: dict[str, str] | None = None,
    auto_merge: bool | None = True,
    profile: str | None = None,
) -> str:
    """Cartridge text binding every role to the scripted runner (or to an override table).

    ``auto_merge=None`` leaves workflow.auto_merge out (the profile's default
    applies); ``profile`` sets workflow.profile.
    """
    checks = checks if checks is not None else []
    quoted = ", ".join('"' + c.replace("\\", "\\\\").replace('"', '\\"') + '"' for c in checks)
    workflow = '[workflow]\nbase_branch = "main"\n'
    if auto_merge is not None:
        workflow += f"auto_merge = {str(auto_merge).lower()}\n"
    if profile is not None:
        workflow += f'profile = "{profile}"\n'
    parts = [
        workflow,
        f"[landing_areas]\nchecks = [{quoted}]\ncheck_timeout = 60\n",
        extra,
    ]
    for role in ROLES:
        body = (role_overrides or {}).get(role)
        parts.append(
            f"[roles.{role}]\n"
            + (body or f'runner = "scripted"\nscript = "{answers_file}"\ntimeout = 30\n')
        )
    return "\n".join(parts)


HAPPY_ANSWERS = """
[[plan]]
text = "1. Write feature.txt"
[[plan_review]]
text = "VERDICT: approve"
[[build]]
text = "wrote feature.txt"
input_tokens = 100
output_tokens = 50
cost_usd = 0.01
[build.files]
"feature.txt" = "the feature\\n"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""


@pytest.fixture
def happy_repo(tmp_path: Path) -> Path:
    """A repository whose cartridge runs the happy path with scripted agents."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


@pytest.fixture
def engine_for() -> Callable[..., tuple[Engine, Store]]:
    """Build an Engine (and its Store) for a repository with a cartridge."""
    stores: list[Store] = []

    def build(repo: Path, **kwargs: object) -> tuple[Engine, Store]:
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        stores.append(store)
        return Engine(repo, cartridge, store, **kwargs), store  # type: ignore[arg-type]

    yield build
    for store in stores:
        store.close()


@pytest.fixture
def server_factory() -> Iterator[Callable[[Mapping[str, Sequence[Step]]], ScriptedModelServer]]:
    """Start scripted model servers (phasegate.testing.model_server); all stopped after the test."""
    servers: list[ScriptedModelServer] = []

    def start(scripts: Mapping[str, Sequence[Step]]) -> ScriptedModelServer:
        server = ScriptedModelServer(scripts).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


#: Commands ``phasegate_cli`` runs as processes: they run until stopped, or start
#: what a test then drives by signals. Every other command runs in the test's own
#: process, through the console script's Typer app: a new interpreter's imports cost
#: 0.4 CPU-seconds a command, hundreds of times a run. tests/test_cli.py runs every
#: command as a process, as a person does.
PROCESS_COMMANDS = frozenset({"worker", "serve", "watch", "demo", "events"})

_PR_SET_DUMPABLE = 4

#: Whether ``phasegate_cli`` runs a command in this process (tests/test_cli.py: never).
IN_PROCESS = True


def phasegate_cli(
    *args: str, cwd: Path | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``phasegate`` console script, in this process unless its command
    is one of ``PROCESS_COMMANDS``, ``cwd`` is given or an argument is not UTF-8
    (``phasegate_in_process``)."""
    if IN_PROCESS and args and args[0] not in PROCESS_COMMANDS and cwd is None and _utf8(args):
        return phasegate_in_process(*args, env=env, timeout=timeout)
    exe = Path(sys.executable).parent / "phasegate"
    return subprocess.run(
        [str(exe), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def _utf8(args: Sequence[str]) -> bool:
    try:
        "".join(args).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def phasegate_in_process(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``args`` run by phasegate's Typer app in this process, as the console script
    would run them: its exit code, standard output and standard error (its log
    lines too). ``env`` is added to the environment for the command's time. A
    command still running after ``timeout`` seconds ends this process with every
    thread's traceback (xdist reports the test as crashed), as a hung ``phasegate``
    process would have been killed."""
    from typer.testing import CliRunner

    from phasegate.cli import app, log_handler

    handler = log_handler()
    root = logging.getLogger()
    root.addHandler(handler)
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        result = CliRunner().invoke(app, list(args), env=env)
    finally:
        faulthandler.cancel_dump_traceback_later()
        root.removeHandler(handler)
        # A run makes its process non-dumpable (proc/sandbox.py): that process ends
        # with the command, and this one is the test's.
        ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["phasegate", *args], result.exit_code, result.stdout, result.stderr
    )


# -- GitHub: the fake server behind Prism --------------------------------------------


@pytest.fixture(scope="session")
def prism() -> Iterator[PrismProxy]:
    """One Prism for the session (its start and schema compiles cost seconds); each
    test's fake GitHub is put behind it by ``github``. Skipped where Prism is not
    installed, failed instead in CI (``.ci/run`` installs it)."""
    try:
        find_prism()
        find_description()
    except PrismError as missing:
        if os.environ.get("CI") or os.environ.get("PHASEGATE_PRISM"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))
    proxy = PrismProxy("http://127.0.0.1:9")
    with proxy:  # its __enter__ returns the URL, not the proxy
        yield proxy


@dataclass
class GitHubLab:
    """A fake GitHub (``server``) reached through Prism at ``api_url``, holding
    ``repository`` with the bot phasegate acts as and three people: maya
    (maintain), olga (admin) and rex (read)."""

    server: GitHubServer
    api_url: str
    repository: str
    bot: User
    people: dict[str, User]

    def cartridge(self, extra: str = "") -> str:
        """A ``[forge]`` table for this lab (poll_s short: tests wait on it, unless
        ``extra`` sets it)."""
        poll = "" if re.search(r"^poll_s\s*=", extra, re.MULTILINE) else "poll_s = 0.2\n"
        return (
            f'[forge]\nkind = "github"\nrepository = "{self.repository}"\n'
            f'base_url = "{self.api_url}"\n{poll}{extra}'
        )


@pytest.fixture
def github(
    prism: PrismProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GitHubLab]:
    """A fresh fake GitHub per test, every REST exchange judged by GitHub's schema:
    the test fails on any violation Prism saw. GITHUB_TOKEN is the bot's token."""
    with GitHubServer(root=tmp_path / "fake-github") as server:
        prism.upstream_url = server.url
        prism.reset()
        bot = server.add_user("phasegate-bot")
        people = {login: server.add_user(login) for login in ("maya", "olga", "rex")}
        monkeypatch.setenv("GITHUB_TOKEN", bot.token)
        lab = GitHubLab(server, prism.url, "octo/widgets", bot, people)
        yield lab
        prism.assert_clean()


def github_repo(
    lab: GitHubLab, path: Path, cartridge: str, files: dict[str, str], forge_extra: str = ""
) -> Path:
    """A local repository holding ``files`` and the cartridge ``cartridge`` (plus the
    lab's [forge] table), pushed to the lab as ``octo/widgets``; the bot may write,
    maya maintains, olga administers, rex reads. ``forge_extra``: more [forge] keys.
    Returns the local path."""
    text = cartridge + "\n" + lab.cartridge(forge_extra)
    repo = make_repo(path, {**files, "phasegate.toml": text})
    lab.server.create_repo("octo", "widgets", from_path=repo)
    for login, permission in (
        ("phasegate-bot", "write"),
        ("maya", "maintain"),
        ("olga", "admin"),
        ("rex", "read"),
    ):
        lab.server.grant(lab.repository, login, permission)
    return repo


# -- a build agent that records its prompts (the forge tests) -------------------------

#: Scripted answers for every role but build, which ``recording_build`` plays.
ANSWERS_BUT_BUILD = """
[[plan]]
text = "1. Write feature.txt"
[[plan_review]]
text = "VERDICT: approve"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "feature.txt is on the merge commit.\\nVERDICT: confirmed"
"""


def recording_build(prompts: Path) -> str:
    """A ``[roles.build]`` body: a command agent that writes each prompt it gets to
    ``prompts/`` (``recorded_prompts`` reads them) and changes feature.txt."""
    return (
        'runner = "command"\n'
        f'command = "cat > {prompts}/build-$(ls {prompts} | wc -l).txt; '
        'echo feature $(date +%N) > feature.txt; echo built"\n'
    )


def recorded_prompts(prompts: Path) -> list[str]:
    """The prompts ``recording_build`` wrote, oldest first."""
    return [p.read_text() for p in sorted(prompts.iterdir(), key=lambda p: p.stat().st_mtime_ns)]
