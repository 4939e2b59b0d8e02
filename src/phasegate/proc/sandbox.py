"""How an agent or check process is confined: bubblewrap, or none.

A caller builds a ``Confinement`` (what may be written, whether the network
is reachable) and ``phasegate.proc.process.run_supervised`` runs the command
through ``wrap``. Under bubblewrap (``bwrap``):

- the whole filesystem is read-only (``--ro-bind / /``) but for the
  ``writable`` paths (the worktree, the runner's state dir: the isolated
  HOME/CODEX_HOME) and a private temp dir made per run (``TMPDIR``); the
  ``protected`` paths (the repository's git dir, its ``.phasegate`` store)
  are read-only again even inside a writable path, and a writable path inside
  a protected one (``.phasegate/agents/<id>``) writable again: mounts go
  parents first, so the deepest rule wins;
- the person's home, other worktrees and the rest of /tmp are read-only;
- a PID namespace of its own with a fresh /proc: phasegate's process, its
  environment and its memory are out of sight (``/proc/<pid>`` of phasegate
  is no process there);
- no capability at all (``--cap-drop ALL``), run as root too: a process of a
  root phasegate cannot remount ``/`` writable or override permissions; and
  ``/proc/sys`` (the kernel's settings) read-only, with a UTS namespace of its
  own (its hostname is its own);
- a new session (no ``TIOCSTI`` into phasegate's terminal), dies with its
  parent; the network is reachable unless ``network`` is off
  (``--unshare-net``: only a loopback of its own).

The supervisor stays outside the sandbox, so a timeout or a cancellation
still stops the whole tree. A refused write is an EROFS inside the sandbox
that phasegate does not see; ``refused_writes`` finds the ones the process
reported in its output (the runners record them as ``sandbox_denied``).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from phasegate.config.cartridge import CARTRIDGE_FILE, Cartridge, CartridgeError

__all__ = [
    "PROCESS_RUNNERS",
    "SANDBOX_VAR",
    "Bubblewrap",
    "Confinement",
    "NoSandbox",
    "Sandbox",
    "SandboxKind",
    "agent_confinement",
    "bwrap_works",
    "check_confinement",
    "choose",
    "confinement",
    "for_checkout",
    "make_undumpable",
    "refused_writes",
    "sandbox_for",
    "sandbox_plan",
    "sandbox_problems",
    "start_confined",
    "unconfined_warning",
]

SandboxKind = Literal["bwrap", "none"]

#: The machine's default sandbox for the roles and checks a cartridge leaves unset.
SANDBOX_VAR = "PHASEGATE_SANDBOX"

_PR_SET_DUMPABLE = 4
_MAX_DENIED = 20  # violations named per run; a loop of refused writes is one story


@dataclass(frozen=True)
class Confinement:
    """How one process is confined.

    - ``kind``: "bwrap" or "none" (unconfined);
    - ``writable``: absolute paths the process may write (its cwd, its state dir);
    - ``protected``: paths read-only even inside a writable one (a git dir);
    - ``network``: whether it reaches the network (off: its own loopback only);
    - ``reason``: why this kind was chosen, for ``doctor`` and the warning.
    """

    kind: SandboxKind = "none"
    writable: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = ()
    network: bool = True
    reason: str = ""

    @property
    def confined(self) -> bool:
        return self.kind != "none"

    def allows(self, path: Path) -> bool:
        """Whether ``path`` (absolute) lies where this confinement lets a process write."""
        best: tuple[int, bool] = (-1, not self.confined)
        for area, allowed in [(p, True) for p in self.writable] + [
            (p, False) for p in self.protected
        ]:
            if path == area or area in path.parents:
                depth = len(area.parts)
                if depth > best[0] or (depth == best[0] and not allowed):
                    best = (depth, allowed)
        return best[1]


class Sandbox(Protocol):
    """Turns a command line into the confined one (the seam; ``NoSandbox`` is the trivial one)."""

    def wrap(self, argv: Sequence[str], c: Confinement, cwd: Path, tmp: Path) -> list[str]:
        """The command line that runs ``argv`` in ``cwd`` confined by ``c``, with ``tmp``
        (an existing directory) as its private temp dir."""
        ...


class NoSandbox:
    """Runs the command as it is."""

    def wrap(self, argv: Sequence[str], c: Confinement, cwd: Path, tmp: Path) -> list[str]:
        return list(argv)


#: What of /proc must be read-only inside the sandbox (the kernel's settings, SysRq).
_PROC_KNOBS = ("/proc/sys", "/proc/sysrq-trigger")


class Bubblewrap:
    """bubblewrap (``bwrap``, 0.8 or later): see the module docstring for what it confines."""

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable or shutil.which("bwrap") or "bwrap"

    def wrap(self, argv: Sequence[str], c: Confinement, cwd: Path, tmp: Path) -> list[str]:
        args = [self.executable, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        # The fresh /proc leaves the kernel's knobs writable to a root process, even
        # without capabilities (a trial wrote kernel.domainname on the host; a
        # core_pattern of "|script" would run that script as root outside).
        for knob in _PROC_KNOBS:
            if Path(knob).exists():
                args += ["--ro-bind", knob, knob]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
        args.append("--new-session")
        # Run as root (a container, CI), bwrap would leave the process every capability:
        # CAP_SYS_ADMIN remounts / writable, CAP_DAC_OVERRIDE ignores permissions.
        args += ["--cap-drop", "ALL"]
        if not c.network:
            args.append("--unshare-net")
        mounts = [(p, "--bind") for p in (*c.writable, tmp)]
        mounts += [(p, "--ro-bind") for p in c.protected]
        # Parents first, and at equal depth read-only last: the deepest rule wins.
        mounts.sort(key=lambda m: (len(m[0].parts), m[1] == "--ro-bind"))
        for path, flag in mounts:
            if path.exists():  # nothing to bind yet; its parent's rule holds for it
                args += [flag, str(path), str(path)]
        args += ["--setenv", "TMPDIR", str(tmp), "--chdir", str(cwd), "--", *argv]
        return args


def sandbox_for(confinement: Confinement | None) -> Sandbox:
    """The Sandbox that applies ``confinement`` (None or "none": NoSandbox)."""
    if confinement is None or not confinement.confined:
        return NoSandbox()
    return Bubblewrap()


def bwrap_works() -> str | None:
    """None when bubblewrap confines processes on this machine, else why not (one line).

    Runs ``true`` under the very command line ``Bubblewrap`` builds
    (``--unshare-net`` included), once per process for each ``bwrap`` that
    ``PATH`` finds: the answer is cached.
    """
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    return _bwrap_works_at(exe)


@functools.cache
def _bwrap_works_at(exe: str) -> str | None:
    """``bwrap_works`` for the ``bwrap`` at ``exe``."""
    tmp = Path(tempfile.mkdtemp(prefix="phasegate-probe-"))
    probe = Bubblewrap(exe).wrap(["true"], Confinement("bwrap", network=False), tmp, tmp)
    try:
        done = subprocess.run(
            probe, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{exe} cannot run: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return f"{exe} fails here: {why[-1] if why else f'exit code {done.returncode}'}"
    return None


def choose(
    setting: SandboxKind | None, environ: Mapping[str, str] | None = None
) -> tuple[SandboxKind, str]:
    """The sandbox a ``sandbox`` cartridge value gets, and why.

    None (the default) is ``PHASEGATE_SANDBOX`` from the environment when it
    is "bwrap" or "none" (the machine's default for what the cartridge leaves
    unset), else bwrap where it works, else none; "none" is none; "bwrap" is
    bwrap, with the reason it will fail when it does not work here (``doctor``
    and the start of a run turn that into an error naming the key).
    """
    machine = (os.environ if environ is None else environ).get(SANDBOX_VAR, "")
    if setting is None and machine == "none":
        return "none", f"{SANDBOX_VAR}=none in the environment"
    if setting is None and machine == "bwrap":
        why_not = bwrap_works()
        return "bwrap", f"{SANDBOX_VAR}=bwrap" if why_not is None else f"unavailable: {why_not}"
    if setting == "none":
        return "none", 'sandbox = "none" in the cartridge'
    why_not = bwrap_works()
    if setting == "bwrap":
        return "bwrap", ('sandbox = "bwrap"' if why_not is None else f"unavailable: {why_not}")
    if why_not is None:
        return "bwrap", "bubblewrap works here (the default)"
    return "none", f"the default, but {why_not}"


def confinement(
    setting: SandboxKind | None,
    *,
    network: bool,
    writable: Sequence[Path],
    protected: Sequence[Path] = (),
) -> Confinement:
    """The Confinement of a process for the cartridge's ``sandbox``/``network`` values."""
    kind, reason = choose(setting)
    return Confinement(
        kind,
        tuple(_absolute(p) for p in writable),
        tuple(_absolute(p) for p in protected),
        network=network,
        reason=reason,
    )


def _absolute(path: Path) -> Path:
    return Path(os.path.realpath(path))


def agent_confinement(
    setting: SandboxKind | None,
    *,
    network: bool,
    cwd: Path,
    state_dir: Path | None,
    repo: Path,
) -> Confinement:
    """An agent's Confinement: ``cwd`` and ``state_dir`` writable; the repository's
    git dir and ``.phasegate`` (the store, other worktrees) read-only, even when
    ``cwd`` is the checkout itself."""
    writable = [cwd] if state_dir is None else [cwd, state_dir]
    return confinement(
        setting,
        network=network,
        writable=writable,
        protected=[repo / ".git", repo / ".phasegate", cwd / ".git"],
    )


def check_confinement(setting: SandboxKind | None, *, network: bool) -> Confinement:
    """The checks' Confinement, before their checkout is known (``for_checkout``)."""
    return confinement(setting, network=network, writable=())


def for_checkout(c: Confinement, checkout: Path) -> Confinement:
    """``c`` with ``checkout`` writable, its ``.git`` not."""
    return replace(
        c,
        writable=(*c.writable, _absolute(checkout)),
        protected=(*c.protected, _absolute(checkout / ".git")),
    )


# -- what a cartridge gets ------------------------------------------------------------

#: The runners that start a process on this machine (scripted and api run in phasegate).
PROCESS_RUNNERS = frozenset(
    {
        "command",
        "claude-code",
        "codex",
        "mini-swe-agent",
        "aider",
        "gemini",
        "opencode",
        "qwen",
        "copilot",
    }
)


def sandbox_plan(cartridge: Cartridge) -> dict[str, tuple[SandboxKind, str]]:
    """Which sandbox each process phasegate starts gets, and why, by cartridge key:
    ``roles.NAME`` for each bound role whose runner starts a process, and
    ``landing_areas`` for the checks when there are any."""
    plan: dict[str, tuple[SandboxKind, str]] = {}
    for name in cartridge.workflow_roles():
        binding = getattr(cartridge.roles, name, None)
        if binding is not None and binding.runner in PROCESS_RUNNERS:
            plan[f"roles.{name}"] = choose(binding.sandbox)
    if cartridge.landing_areas.checks:
        plan["landing_areas"] = choose(cartridge.landing_areas.sandbox)
    return plan


def sandbox_problems(cartridge: Cartridge) -> list[str]:
    """Each ``sandbox = "bwrap"`` that cannot work on this machine, naming its key."""
    problems = []
    machine = os.environ.get(SANDBOX_VAR, "")
    if machine not in ("", "bwrap", "none"):
        problems.append(f'{SANDBOX_VAR}={machine!r}: give "bwrap" or "none"')
    for key, (kind, _reason) in sandbox_plan(cartridge).items():
        if kind == "bwrap" and bwrap_works() is not None:
            problems.append(f'{key}.sandbox = "bwrap", but {bwrap_works()}')
    return problems


def unconfined_warning(cartridge: Cartridge) -> str | None:
    """The loud warning for the roles and checks that will run unconfined, or None."""
    loose = [
        f"{key} ({reason})"
        for key, (kind, reason) in sandbox_plan(cartridge).items()
        if kind == "none"
    ]
    if not loose:
        return None
    return (
        "WARNING: these agents/checks run UNCONFINED, with write access to everything "
        "this user can write (the repository's .git, your home): " + "; ".join(loose)
    )


def start_confined(cartridge: Cartridge, warn: Callable[[str], None]) -> None:
    """What a run or a worker does first: refuse a ``sandbox = "bwrap"`` that cannot
    work (CartridgeError naming the key), ``warn`` once about what runs unconfined,
    and, when anything does, make this process non-dumpable (``make_undumpable``)."""
    problems = sandbox_problems(cartridge)
    if problems:
        raise CartridgeError(f"{CARTRIDGE_FILE}: " + "; ".join(problems))
    warning = unconfined_warning(cartridge)
    if warning is not None:
        warn(warning)
        make_undumpable()


# -- refused writes -----------------------------------------------------------------

_EROFS = re.compile(r"read-only file system|\bEROFS\b", re.I)
_QUOTED = re.compile(r"'([^'\n]+)'|\"([^\"\n]+)\"|‘([^’\n]+)’|`([^`'\n]+)'")
_PATHLIKE = re.compile(r"(?<![\w/.~-])(~?/[^\s:'\",;)]+|\.?[\w.-]+/[^\s:'\",;)]+)")


def refused_writes(
    output: str, c: Confinement, cwd: Path, *, prompt: str = ""
) -> list[tuple[str, str]]:
    """The writes a confined process's ``output`` reports refused: (path, line) pairs.

    A line saying "Read-only file system" (or EROFS) names a refused write
    (in a JSON line, a line of one of its strings: tools' outputs in an event
    stream or a transcript);
    its path is the quoted one, else the path-like word nearest before the
    message (``sh: 1: cannot create /x: ...``), else the first after it;
    relative paths are taken from ``cwd``. One pair per distinct path that
    lies outside ``c``'s writable areas ("" for a line that names none), at
    most 20, each line cut to 300 characters. A line that is in ``prompt``
    (a transcript repeats the ticket) is not the process's. What a process
    was refused without printing it is not seen. Nothing for an unconfined
    ``c``.
    """
    if not c.confined:
        return []
    found: dict[str, str] = {}
    for line in _lines(output):
        hit = _EROFS.search(line)
        if hit is None or (prompt and line.strip() in prompt):
            continue
        shown = line.strip()[:300]
        paths = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(line)]
        paths = [p for p in paths if "/" in p or "." in p] or _nearest(line, hit)
        if not paths:
            found.setdefault("", shown)
        for raw in paths:
            path = Path(os.path.normpath(cwd / os.path.expanduser(raw)))
            if not c.allows(path):
                found.setdefault(str(path), shown)
        if len(found) >= _MAX_DENIED:
            break
    return list(found.items())[:_MAX_DENIED]


def _lines(output: str) -> Iterator[str]:
    """The lines of ``output``; a JSON line (an agent's event stream, its transcript)
    gives the lines of each string in it instead: its tools' outputs."""
    for line in output.splitlines():
        if not _EROFS.search(line):
            continue
        try:
            value = json.loads(line) if line.lstrip().startswith(("{", "[")) else None
        except ValueError:
            value = None
        if value is None:
            # A line of a JSON document spread over lines: its strings still escaped.
            yield from line.replace("\\n", "\n").replace('\\"', '"').splitlines()
            continue
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                yield from item.splitlines()
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)


def _nearest(line: str, hit: re.Match[str]) -> list[str]:
    before = _PATHLIKE.findall(line[: hit.start()])
    if before:
        return [before[-1]]
    after = _PATHLIKE.findall(line[hit.end() :])
    return after[:1]


# -- phasegate's own process -----------------------------------------------------------


def make_undumpable() -> bool:
    """Make this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``); False where
    Linux's prctl is missing.

    Its ``/proc/<pid>/environ``, ``mem`` and ``maps`` become root's and a
    process of the same non-root user can neither read them nor ptrace it; no
    core dump holds its secrets. A root process (CAP_SYS_PTRACE) still can:
    for that, only the sandbox's PID namespace helps. Children started with
    ``exec`` are dumpable again (the supervisor; its environment is the
    agent's filtered one).
    """
    if not sys.platform.startswith("linux"):
        return False
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:
        return False
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    return True
