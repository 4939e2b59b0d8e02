"""Child process helpers shared by runners and checks."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["kill_orphan_group", "kill_process_group", "start_ticks"]

_POLL_S = 0.05


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if unknown.

    With the pid, it names one process for good: a pid is reused, a
    (pid, start ticks) pair is not.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 else None


def kill_orphan_group(pgid: int, ticks: int | None) -> bool:
    """SIGKILL the process group an agent left running when its worker died.

    Only when the group is ours: its leader is the process that started at
    ``ticks``, or the leader is gone and members remain (Linux does not hand
    out a pid still in use as a process group id). Returns whether it killed.
    """
    if not _group_running(pgid):
        return False
    leader = start_ticks(pgid)
    if leader is not None and ticks is not None and leader != ticks:
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running; zombies do not count.

    A zombie no parent reaps (an orphan under an init that does not reap) still
    answers ``killpg(pgid, 0)``, so on Linux the members are read from /proc.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return True
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it exited while we looked
        # The command name may hold spaces and parentheses; the fields after the
        # last ")" are fixed: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def kill_process_group(proc: subprocess.Popen[str], grace_s: float = 2.0) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL what survives ``grace_s`` seconds.

    The whole group must be gone, not only ``proc``: a child that ignores
    SIGTERM would otherwise outlive a killed agent or check and keep its
    stdout open, and reading that output would wait for the child.
    ``proc`` must have been started with ``start_new_session=True``.
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while True:
        proc.poll()  # reap the leader: an unreaped leader still counts as a member
        if not _group_running(proc.pid):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()
