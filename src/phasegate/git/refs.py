"""The repository's locks and its ref ledger: what lets the guard tell a ref
phasegate moved from one an agent moved (``phasegate.git.command``'s docstring).

The ledger (``<common>/LEDGER``) is one JSON line per ref a phasegate command
moved: ``{"ref": name, "to": value}``. Commands append while holding the refs
lock (``REFS_LOCK``) shared; the guard holds it exclusively to compare. Each
command reads the refs after it ran and appends what moved in one turn of
``ledger_turn``, so the ledger's order is the order in which those values were
seen: the last line of a ref is the newest value phasegate saw it at, however
many workers' commands ran side by side (two merges into the base in two
processes, and a third command whose "after" was read between them and
written last, once put the older merge's value last: the guard then undid the
newer merge as the agent's).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from phasegate.git.errors import GitTransient

__all__ = [
    "LEDGER",
    "LEDGER_TURN",
    "REFS_LOCK",
    "ledger_turn",
    "read_ledger",
    "record_refs",
    "refs_lock",
    "repository_flock",
]

#: The ref ledger and its lock, relative to the repository's common directory.
LEDGER = "phasegate/ref-ledger"
REFS_LOCK = "phasegate/refs.lock"

#: The lock one command's read-and-append of the ledger holds (``ledger_turn``).
LEDGER_TURN = "phasegate/ledger.lock"


@contextmanager
def repository_flock(path: Path, timeout_s: float, poll_s: float = 0.02) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` while the block runs, across threads and
    processes (the file is opened anew per acquisition, so two threads of one
    process exclude each other too); the kernel drops it when its holder dies.
    Raises GitTransient, naming ``path``, after ``timeout_s`` seconds of waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GitTransient(f"{path} is still held after {timeout_s:g}s") from None
                time.sleep(poll_s)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def refs_lock(common: Path, *, exclusive: bool, timeout_s: float = 120.0) -> Iterator[None]:
    """The repository's refs lock (``<common>/REFS_LOCK``): shared by phasegate's
    ref-moving commands (they do not exclude each other), exclusive for the guard
    comparing refs with a snapshot, so no ledger line is still to come for a ref
    it sees moved. Raises GitTransient after ``timeout_s`` seconds of waiting."""
    path = common / REFS_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with path.open("a") as handle:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GitTransient(f"{path} is still held after {timeout_s:g}s") from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record_refs(common: Path, before: dict[str, str], after: dict[str, str]) -> None:
    """Append to the ref ledger every ref that differs between ``before`` and
    ``after`` (``"to": ""`` for a deleted one); one write per line (O_APPEND)."""
    lines = [
        json.dumps({"ref": name, "to": after.get(name, "")}) + "\n"
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    ]
    if not lines:
        return
    path = common / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for line in lines:
            os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_ledger(common: Path, offset: int) -> tuple[dict[str, str], int]:
    """The ledger's lines from byte ``offset`` on: refname → the last value phasegate
    moved it to ("" deleted), and the ledger's size now (read from 0 again when it
    shrank: it was replaced)."""
    path = common / LEDGER
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(offset if offset <= size else 0)
            data = handle.read()
            size = handle.tell()
    except FileNotFoundError:
        return {}, 0
    moved: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill: its command's ref, if moved, is the guard's to judge
        moved[str(entry.get("ref"))] = str(entry.get("to", ""))
    return moved, size


@contextmanager
def ledger_turn(common: Path, timeout_s: float = 120.0) -> Iterator[None]:
    """One command at a time reads the refs it left and appends them to the
    ledger (an flock on ``<common>/LEDGER_TURN``): the ledger's lines then come in
    the order their values were seen (the module's docstring). Raises
    GitTransient after ``timeout_s`` seconds of waiting."""
    with repository_flock(common / LEDGER_TURN, timeout_s, poll_s=0.002):
        yield
