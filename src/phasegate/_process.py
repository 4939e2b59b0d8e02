"""Child process helpers shared by runners and checks."""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["kill_process_group"]


def kill_process_group(proc: subprocess.Popen[str], grace_s: float = 2.0) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL what survives ``grace_s`` seconds.

    ``proc`` must have been started with ``start_new_session=True``.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
