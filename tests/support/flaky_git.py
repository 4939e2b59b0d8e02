"""A ``git`` that fails some of its calls the way lock contention does.

``FlakyGit(root, fraction=0.2, seed=7)`` writes an executable ``git`` into
``root/bin`` that, on each call, decides from the seed and the call's number
(kept in ``root/calls``, under an flock, so concurrent processes count as one)
whether to fail: a failing call prints git's own lock-contention message to
stderr and exits 128 *before* the real git runs, so it changes nothing; every
other call execs the real git (found on PATH when the wrapper is written).

Put ``flaky.bin`` first on PATH (``flaky.env()``, or ``with flaky.on_path():``)
for the code under test; ``flaky.calls`` and ``flaky.failures`` say how many
calls it saw and failed; ``flaky.fraction`` can be changed between calls
(0.0 = a healthy git). ``commands=("merge",)`` fails only those subcommands
(the first argument after git's own options).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["FlakyGit"]

_WRAPPER = """\
#!{python} -S
import fcntl, json, os, random, sys
ROOT = {root!r}
REAL = {real!r}
with open(os.path.join(ROOT, "calls"), "a+") as counter:
    fcntl.flock(counter, fcntl.LOCK_EX)
    counter.seek(0)
    state = json.loads(counter.read() or '{{"calls": 0, "failures": 0}}')
    with open(os.path.join(ROOT, "config")) as f:
        config = json.load(f)
    state["calls"] += 1
    fail = random.Random(f"{{config['seed']}}:{{state['calls']}}").random() < config["fraction"]
    if config["commands"] is not None:
        args = sys.argv[1:]
        while args and args[0].startswith("-"):
            args = args[2:] if args[0] in ("-c", "-C") else args[1:]
        fail = fail and bool(args) and args[0] in config["commands"]
    state["failures"] += fail
    counter.seek(0)
    counter.truncate()
    counter.write(json.dumps(state))
if fail:
    sys.stderr.write(
        "fatal: Unable to create '" + os.path.join(os.getcwd(), ".git", "index.lock")
        + "': File exists.\\n\\nAnother git process seems to be running in this repository, "
        "e.g.\\nan editor opened by 'git commit'. Please make sure all processes\\n"
        "are terminated then try again. If it still fails, a git process\\n"
        "may have crashed in this repository earlier:\\n"
        "remove the file manually to continue.\\n"
    )
    sys.exit(128)
os.execv(REAL, [REAL, *sys.argv[1:]])
"""


class FlakyGit:
    """A lock-contention-failing ``git`` wrapper in ``root/bin`` (see the module doc)."""

    def __init__(
        self,
        root: Path,
        *,
        fraction: float = 0.2,
        seed: int = 0,
        commands: Sequence[str] | None = None,
    ) -> None:
        real = shutil.which("git")
        if real is None:
            raise FileNotFoundError("no git on PATH to wrap")
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.commands = list(commands) if commands is not None else None
        self.fraction = fraction
        wrapper = self.bin / "git"
        wrapper.write_text(_WRAPPER.format(python=sys.executable, root=str(root), real=real))
        wrapper.chmod(0o755)

    @property
    def fraction(self) -> float:
        return float(json.loads((self.root / "config").read_text())["fraction"])

    @fraction.setter
    def fraction(self, value: float) -> None:
        tmp = self.root / "config.tmp"
        config = {"seed": self.seed, "fraction": value, "commands": self.commands}
        tmp.write_text(json.dumps(config))
        os.replace(tmp, self.root / "config")

    def _state(self) -> dict[str, int]:
        path = self.root / "calls"
        text = path.read_text() if path.exists() else ""
        return json.loads(text or '{"calls": 0, "failures": 0}')

    @property
    def calls(self) -> int:
        return self._state()["calls"]

    @property
    def failures(self) -> int:
        return self._state()["failures"]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: os.environ) with the wrapper's bin first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    @contextlib.contextmanager
    def on_path(self) -> Iterator[FlakyGit]:
        """The wrapper first on this process's PATH while the block runs."""
        saved = os.environ.get("PATH", "")
        os.environ["PATH"] = f"{self.bin}{os.pathsep}{saved}"
        try:
            yield self
        finally:
            os.environ["PATH"] = saved
