"""The kill-torture harness's trial: its repository, its agents, its processes.

``Lab`` builds one trial's repository (classic: command agents that append a
line to ``changes.txt`` in two writes; graph: the demo's sample through the
development graph; github, gitlab, gitea: classic, on that forge's fake, its
rig one module (``torture_forge``: ``torture_github``, ``torture_gitlab`` …);
postgres: classic on a PostgreSQL store, several workflows each appending to
``changes-<workflow id>.txt``, ``torture_postgres``), files its workflows,
starts its ``phasegate worker`` processes and reads its store through a
``Store`` of its own (reads only: ``Lab.read``), on either database.
``trial_processes`` finds every process of a trial by its working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from phasegate.store import Store

    from support.torture_forge import TrialForge

__all__ = ["ANSWERS", "FORGE_DIR", "FORGES", "Lab", "Violation", "kill_all", "trial_processes"]

#: Where a forge trial's fake forge keeps its data, under the trial's root: the
#: fake's own git processes are not the trial's (no kill, no ``process_alive``).
FORGE_DIR = "forge"
#: The trial modes on a remote forge's fake: each its rig (``torture_forge.ForgeRig``).
FORGES = ("github", "gitlab", "gitea")


@dataclass(frozen=True)
class Violation:
    """An invariant a settled trial broke: its kind and what was found."""

    kind: str
    detail: str


# The agents: read the prompt, sleep a little, answer; the build role appends one
# line in two writes with a sleep between, so a kill can leave half a line behind.
# With several workflows (postgres) each appends to a file of its own: their
# merges never conflict.
AGENT_SCRIPT = """\
import hashlib, json, os, random, sys, time
from pathlib import Path

role, config = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
prompt = sys.stdin.read()
rng = random.Random(f"{config['seed']}:{role}:{time.time_ns()}")
time.sleep(rng.uniform(0, config["max_sleep_s"]))
if role == "build":
    token = hashlib.sha1(os.urandom(8)).hexdigest()[:10]
    own = config["per_workflow"]
    name = f"changes-{os.environ['PHASEGATE_WORKFLOW_ID']}.txt" if own else "changes.txt"
    with open(name, "a") as out:
        out.write(f"run-{token}")
        out.flush()
        time.sleep(rng.uniform(0, config["max_sleep_s"]))
        out.write(" ok\\n")
    time.sleep(rng.uniform(0, config["max_sleep_s"]))
print(config["answers"][role])
"""

# The project's own test: every line of changes*.txt is one whole line an agent wrote.
CHECK_SCRIPT = """\
import re, sys
from pathlib import Path

files = sorted(Path().glob("changes*.txt"))
lines = [line for f in files for line in f.read_text().splitlines(keepends=True)]
bad = [line for line in lines if not re.fullmatch(r"run-[0-9a-f]{10} ok\\n", line)]
if not lines or bad:
    sys.exit(f"changes*.txt: {len(lines)} line(s), malformed: {bad[:3]!r}")
"""

ANSWERS = {
    "plan": "1. Append one line to changes.txt.",
    "plan_review": "The plan covers the ticket.\nVERDICT: approve",
    "build": "appended one line to changes.txt",
    "review": "The change is right.\nVERDICT: approve",
    "verification": "changes.txt holds the line on the merge commit.\nVERDICT: confirmed",
}
ROLES = tuple(ANSWERS)
_START_LOCK = threading.Lock()
#: How many times ``Lab.read`` tries a store that is unavailable.
READ_ATTEMPTS = 50
ROW_KEYS = ("current_phase", "status", "error", "branch_name", "lease_owner")
TITLE = "Append one line to changes.txt"
TICKET = "Append one line to changes.txt; check_changes.py must pass."

# -- processes of a trial ---------------------------------------------------------


def trial_processes(root: Path) -> list[int]:
    """Every live process whose working directory is inside ``root`` (the trial's
    repository, worktrees and scratch checkouts), this one excepted."""
    found = []
    prefix = str(root.resolve())
    forge = f"{prefix}/{FORGE_DIR}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        inside = cwd == prefix or cwd.startswith(prefix + "/")
        if state not in ("Z", "X") and inside and not (cwd + "/").startswith(forge + "/"):
            found.append(int(entry.name))
    return found


def kill_all(root: Path, worker: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL every process of the trial, as a machine crash would, until none is left."""
    if worker is not None:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
    for _ in range(50):
        pids = trial_processes(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    if worker is not None:
        worker.wait(timeout=10)


# -- the lab ------------------------------------------------------------------------


class Lab:
    """One trial's repository and processes. ``mode`` is ``classic``, ``graph``,
    a forge's name (``FORGES``; it needs ``forge``: the trial's fake forge of that
    name, seeded here) or
    ``postgres`` (which needs ``store_url``: a PostgreSQL schema of the trial's
    own, in the cartridge's ``store.url``; ValueError otherwise). ``close()``
    closes the lab's own Store."""

    def __init__(
        self,
        root: Path,
        seed: int,
        max_sleep_s: float,
        mode: str = "classic",
        forge: TrialForge | None = None,
        store_url: str | None = None,
    ) -> None:
        if (forge.name if forge is not None else None) != (mode if mode in FORGES else None):
            raise ValueError(f"a trial on a forge, and only one, has that forge (mode {mode})")
        if (mode == "postgres") != (store_url is not None):
            raise ValueError("a postgres trial, and only one, has a store_url")
        self.mode = mode
        self.forge = forge
        self.store_url = store_url
        self.root = root.resolve()
        self.repo = self.root / "repo"
        self.db = self.repo / ".phasegate" / "state.db"
        self.logs = self.root / "logs"
        self.workers = 0
        self._store: Store | None = None  # opened by the first start_workflow
        self.logs.mkdir(parents=True, exist_ok=True)
        config = self.root / "agent.json"
        config.write_text(
            json.dumps(
                {
                    "seed": seed,
                    "max_sleep_s": max_sleep_s,
                    "answers": ANSWERS,
                    "per_workflow": mode == "postgres",
                }
            )
        )
        agent = self.root / "agent.py"
        agent.write_text(AGENT_SCRIPT)
        if mode == "graph":
            self._make_graph_repo()
        else:
            self._make_repo(agent, config)
        self.base_commits = len(self._git("rev-list", "main").split())
        if forge is not None:
            forge.seed(self.repo)

    @property
    def base_repo(self) -> Path:
        """Where the merged change lands: the repository, or the forge's bare one."""
        return self.forge.bare if self.forge is not None else self.repo

    @property
    def env(self) -> dict[str, str]:
        """The environment of the trial's phasegate processes (the bot's token on a forge)."""
        return {**os.environ, "COLUMNS": "200", **(self.forge.env if self.forge else {})}

    def changes_file(self, workflow_id: str) -> str:
        """The file the workflow's build agent appends its lines to."""
        return f"changes-{workflow_id}.txt" if self.mode == "postgres" else "changes.txt"

    def _make_graph_repo(self) -> None:
        """The demo's sample project through the development graph (scripted agents, a
        build answering with a diff), under full-auto: the apply arm lands the patch."""
        from phasegate.tools.demo import make_sample_project

        make_sample_project(self.repo, graph=True)
        cartridge = self.repo / "phasegate.toml"
        cartridge.write_text(
            cartridge.read_text().replace('profile = "auto"', 'profile = "full-auto"', 1)
        )
        self._git("add", "-A")
        self._git(
            "-c", "user.name=person", "-c", "user.email=person@localhost",
            "commit", "-q", "-m", "full-auto",
        )  # fmt: skip

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd or self.repo, check=True, capture_output=True, text=True
        ).stdout.strip()

    def _make_repo(self, agent: Path, config: Path) -> None:
        self.repo.mkdir(parents=True)
        (self.repo / "README.md").write_text("# torture sample\n")
        (self.repo / ".gitignore").write_text(".phasegate/\n__pycache__/\n")
        (self.repo / "check_changes.py").write_text(CHECK_SCRIPT)
        roles = "\n".join(
            f'[roles.{role}]\nrunner = "command"\ntimeout = 60\ncommand = '
            + json.dumps(shlex.join([sys.executable, str(agent), role, str(config)]))
            + "\n"
            for role in ROLES
        )
        (self.repo / "phasegate.toml").write_text(
            '[workflow]\nbase_branch = "main"\nprofile = "full-auto"\n\n'
            f'[landing_areas]\nchecks = ["{sys.executable} check_changes.py"]\n'
            "check_timeout = 60\n\n"
            + roles
            + (f"\n{self.forge.cartridge()}" if self.forge else "")
            + (f'\n[store]\nurl = "{self.store_url}"\n' if self.store_url else "")
        )
        self._git("init", "-q", "-b", "main")
        self._git("add", "-A")
        self._git(
            "-c", "user.name=person", "-c", "user.email=person@localhost",
            "commit", "-q", "-m", "initial",
        )  # fmt: skip

    def start_workflow(self, title: str = TITLE) -> str:
        """File a workflow through the Engine API without running it; returns its id.
        The first one opens (and migrates) the store the lab reads."""
        from phasegate.config.cartridge import load_cartridge
        from phasegate.forge.factory import make_forge
        from phasegate.git.workspace import Workspace
        from phasegate.runtime.engine import Engine
        from phasegate.store import open_store

        with _START_LOCK:  # alembic's migration context is process-global, not per thread
            cartridge = load_cartridge(self.repo)
            if self._store is None:
                self._store = open_store(cartridge.store_url(self.repo))
            store = self._store
            forge = None
            if self.forge is not None:  # the bot's token, not this process's own
                forge = make_forge(cartridge, self.repo, store, Workspace(), [], self.forge.env)
            if self.mode == "graph":
                from phasegate.tools.demo import DEMO_TICKET, DEMO_TITLE

                return Engine(self.repo, cartridge, store).start(DEMO_TITLE, DEMO_TICKET)
            return Engine(self.repo, cartridge, store, forge=forge).start(title, TICKET)

    @property
    def store(self) -> Store:
        """The lab's own Store on the trial's database (after ``start_workflow``)."""
        if self._store is None:
            raise RuntimeError("no workflow was started: the trial has no store yet")
        return self._store

    def close(self) -> None:
        """Close the lab's Store (the trial's processes are not touched)."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def worker(self, concurrency: int | None = None) -> subprocess.Popen[bytes]:
        """Start a ``phasegate worker`` of the trial (``--concurrency`` when given), in a
        session of its own, its output in ``logs/worker-N.log``."""
        self.workers += 1
        extra = ["--concurrency", str(concurrency)] if concurrency is not None else []
        with open(self.logs / f"worker-{self.workers}.log", "wb") as log:
            return subprocess.Popen(
                [phasegate_exe(), "worker", "--repo", str(self.repo), "--poll", "0.1", *extra],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )

    def read(self, statement: sa.Executable) -> list[tuple[Any, ...]]:
        """The rows of a SQLAlchemy ``statement`` (a read), in one read-only transaction
        of the lab's Store: the same on SQLite and PostgreSQL. A store briefly
        unavailable (SQLite recovering a killed writer's WAL) is read again, up to
        ``READ_ATTEMPTS`` times; then StoreUnavailable is raised."""
        from phasegate.store import StoreUnavailable

        for attempt in range(READ_ATTEMPTS):
            try:
                with self.store.reading() as conn:
                    return [tuple(r) for r in conn.execute(statement).all()]
            except StoreUnavailable:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                time.sleep(0.1)
        raise AssertionError("unreachable")

    def claimed_by(self, workflow_id: str, pid: int) -> bool:
        """Whether the worker ``pid`` holds the workflow's lease (owner ``host:pid:...``)."""
        owner = self.row(workflow_id)["lease_owner"]
        return bool(owner and f":{pid}:" in owner)

    def row(self, workflow_id: str) -> dict[str, Any]:
        """The workflow's ``current_phase``, ``status``, ``error``, ``branch_name`` and
        ``lease_owner`` (empty strings and None before it exists)."""
        from phasegate.store import tables as t

        c = t.workflows.c
        rows = self.read(
            sa.select(c.current_phase, c.status, c.error, c.branch_name, c.lease_owner).where(
                c.id == workflow_id
            )
        )
        if not rows:
            return dict.fromkeys(ROW_KEYS, None) | {"current_phase": "", "status": ""}
        return dict(zip(ROW_KEYS, rows[0], strict=True))


def phasegate_exe() -> str:
    found = Path(sys.executable).parent / "phasegate"
    return str(found) if found.exists() else "phasegate"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()[:200]
    except OSError:
        return "?"


def wait_for(probe: Callable[[], bool], timeout_s: float, poll_s: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(poll_s)
    return False
