"""The kill-torture harness's trial: its repository, its agents, its processes.

``Lab`` builds one trial's repository (classic: command agents that append a
line to ``changes.txt`` in two writes; graph: the demo's sample through the
development graph; github: classic, on a fake GitHub, ``torture_github``),
files its workflow, starts its ``phasegate worker`` processes and reads its
store with a plain read-only sqlite3 connection. ``trial_processes`` finds
every process of a trial by its working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phasegate.testing.torture_github import TrialForge

__all__ = ["ANSWERS", "FORGE_DIR", "Lab", "Violation", "kill_all", "trial_processes"]

#: Where a github trial's fake GitHub keeps its data, under the trial's root: the
#: fake's own git processes are not the trial's (no kill, no ``process_alive``).
FORGE_DIR = "github"


@dataclass(frozen=True)
class Violation:
    """An invariant a settled trial broke: its kind and what was found."""

    kind: str
    detail: str


# The agents: read the prompt, sleep a little, answer; the build role appends one
# line in two writes with a sleep between, so a kill can leave half a line behind.
AGENT_SCRIPT = """\
import hashlib, json, os, random, sys, time
from pathlib import Path

role, config = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
prompt = sys.stdin.read()
rng = random.Random(f"{config['seed']}:{role}:{time.time_ns()}")
time.sleep(rng.uniform(0, config["max_sleep_s"]))
if role == "build":
    token = hashlib.sha1(os.urandom(8)).hexdigest()[:10]
    with open("changes.txt", "a") as out:
        out.write(f"run-{token}")
        out.flush()
        time.sleep(rng.uniform(0, config["max_sleep_s"]))
        out.write(" ok\\n")
    time.sleep(rng.uniform(0, config["max_sleep_s"]))
print(config["answers"][role])
"""

# The project's own test: every line of changes.txt is one whole line an agent wrote.
CHECK_SCRIPT = """\
import re, sys
from pathlib import Path

lines = Path("changes.txt").read_text().splitlines(keepends=True)
bad = [line for line in lines if not re.fullmatch(r"run-[0-9a-f]{10} ok\\n", line)]
if not lines or bad:
    sys.exit(f"changes.txt: {len(lines)} line(s), malformed: {bad[:3]!r}")
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
    """One trial's repository and processes. ``mode`` is ``classic``, ``graph`` or
    ``github`` (which needs ``forge``: the trial's fake GitHub, seeded here)."""

    def __init__(
        self,
        root: Path,
        seed: int,
        max_sleep_s: float,
        mode: str = "classic",
        forge: TrialForge | None = None,
    ) -> None:
        if (mode == "github") != (forge is not None):
            raise ValueError("a github trial, and only one, has a forge")
        self.mode = mode
        self.forge = forge
        self.root = root.resolve()
        self.repo = self.root / "repo"
        self.db = self.repo / ".phasegate" / "state.db"
        self.logs = self.root / "logs"
        self.workers = 0
        self.logs.mkdir(parents=True, exist_ok=True)
        config = self.root / "agent.json"
        config.write_text(
            json.dumps({"seed": seed, "max_sleep_s": max_sleep_s, "answers": ANSWERS})
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
        """Where the merged change lands: the repository, or GitHub's bare one."""
        return self.forge.bare if self.forge is not None else self.repo

    @property
    def env(self) -> dict[str, str]:
        """The environment of the trial's phasegate processes (the bot's token on GitHub)."""
        return {**os.environ, "COLUMNS": "200", **(self.forge.env if self.forge else {})}

    def _make_graph_repo(self) -> None:
        """The demo's sample project through the development graph (scripted agents, a
        build answering with a diff), under full-auto: the apply arm lands the patch."""
        from phasegate.demo import make_sample_project

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
            "check_timeout = 60\n\n" + roles + (f"\n{self.forge.cartridge()}" if self.forge else "")
        )
        self._git("init", "-q", "-b", "main")
        self._git("add", "-A")
        self._git(
            "-c", "user.name=person", "-c", "user.email=person@localhost",
            "commit", "-q", "-m", "initial",
        )  # fmt: skip

    def start_workflow(self) -> str:
        """File the workflow through the Engine API without running it; returns its id."""
        from phasegate.cartridge import load_cartridge
        from phasegate.engine import Engine
        from phasegate.forge.github_auth import make_forge
        from phasegate.store import open_store
        from phasegate.workspace import Workspace

        with _START_LOCK:  # alembic's migration context is process-global, not per thread
            cartridge = load_cartridge(self.repo)
            store = open_store(cartridge.store_url(self.repo))
            forge = None
            if self.forge is not None:  # the bot's token, not this process's GITHUB_TOKEN
                forge = make_forge(cartridge, self.repo, store, Workspace(), [], self.forge.env)
            try:
                if self.mode == "graph":
                    from phasegate.demo import DEMO_TICKET, DEMO_TITLE

                    return Engine(self.repo, cartridge, store).start(DEMO_TITLE, DEMO_TICKET)
                return Engine(self.repo, cartridge, store, forge=forge).start(TITLE, TICKET)
            finally:
                store.close()

    def worker(self) -> subprocess.Popen[bytes]:
        self.workers += 1
        with open(self.logs / f"worker-{self.workers}.log", "wb") as log:
            return subprocess.Popen(
                [phasegate_exe(), "worker", "--repo", str(self.repo), "--poll", "0.1"],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        # A plain reader: never migrates, never takes the write lock.
        if not self.db.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            return []  # the schema is still being made
        finally:
            conn.close()

    def claimed_by(self, workflow_id: str, pid: int) -> bool:
        """Whether the worker ``pid`` holds the workflow's lease (owner ``host:pid:...``)."""
        rows = self.query("SELECT lease_owner FROM workflows WHERE id = ?", workflow_id)
        return bool(rows and rows[0][0] and f":{pid}:" in rows[0][0])

    def row(self, workflow_id: str) -> dict[str, Any]:
        rows = self.query(
            "SELECT current_phase, status, error, branch_name FROM workflows WHERE id = ?",
            workflow_id,
        )
        if not rows:
            return {"current_phase": "", "status": "", "error": None, "branch_name": None}
        phase, status, error, branch = rows[0]
        return {"current_phase": phase, "status": status, "error": error, "branch_name": branch}


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
