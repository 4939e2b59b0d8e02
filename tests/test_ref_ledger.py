"""The ref ledger keeps the order in which phasegate saw its refs move.

Two workers merging into the base while a third command of theirs ran once
left the older merge's value last in the ledger; the guard around an agent run
then took the newer merge for the agent's and undid it. Caused here with real
git and the real locks: a command's read of the refs it left is held open
while another command moves the same ref.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from phasegate.git import command as _git
from phasegate.git import guard
from phasegate.git.command import common_dir, read_ledger, run_git

from conftest import git, make_repo


def _commit(repo: Path, name: str) -> str:
    """A commit on no branch (a child of main's), for a ref to be moved to."""
    tree = git(repo, "write-tree")
    return git(repo, "commit-tree", tree, "-p", "main", "-m", name)


def test_a_ref_moved_while_another_command_records_ends_the_ledger_at_its_newest_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    first, second = _commit(repo, "first"), _commit(repo, "second")
    snap = guard.snapshot(repo)  # an unconfined agent run around both commands
    assert snap is not None

    real_list_refs = _git.list_refs
    mover: list[threading.Thread] = []
    moved = threading.Event()

    def move_main_to_second() -> None:
        run_git(["update-ref", "refs/heads/main", second], repo)
        moved.set()

    def list_refs(cwd: Path | str) -> dict[str, str]:
        refs = real_list_refs(cwd)
        if (
            threading.current_thread() is threading.main_thread()
            and refs.get("refs/heads/main") == first
            and not mover
        ):
            # The first command's "after" is read: the second moves main before the
            # first has appended what it saw.
            mover.append(threading.Thread(target=move_main_to_second))
            mover[0].start()
            moved.wait(0.5)  # with the ledger's turn held, it cannot finish meanwhile
        return refs

    monkeypatch.setattr(_git, "list_refs", list_refs)
    run_git(["update-ref", "refs/heads/main", first], repo)
    mover[0].join(10)
    assert moved.is_set()

    common = common_dir(repo)
    assert common is not None
    assert git(repo, "rev-parse", "main") == second
    ledger, _size = read_ledger(common, snap.ledger)
    assert ledger["refs/heads/main"] == second

    # And so the guard sees both moves as phasegate's: nothing undone.
    assert guard.restore(snap) == []
    assert git(repo, "rev-parse", "main") == second
