"""The cartridge workflows run under: ``phasegate.toml`` as committed on the base branch.

Reading it takes git (``phasegate.git.command``), so it lives here, above the
cartridge's model in ``phasegate.config``, which reads no repository.
"""

from __future__ import annotations

from pathlib import Path

from phasegate.config.cartridge import (
    CARTRIDGE_FILE,
    Cartridge,
    CartridgeError,
    cartridge_from_document,
    load_cartridge,
)
from phasegate.config.toml import MAX_TOML_BYTES, TomlError, parse_toml
from phasegate.git.command import GitError, git, run_git

__all__ = ["committed_blob", "committed_note", "load_committed_cartridge"]


def committed_blob(repo: Path, working: Cartridge) -> tuple[str, str | None]:
    """``(base, blob)``: the base branch (``workflow.base_branch`` of ``working``,
    else the branch checked out; "" on a detached HEAD) and the git blob id of
    ``phasegate.toml`` committed on it (None when it has none)."""
    base = working.workflow.base_branch
    if base is None:
        head = run_git(["symbolic-ref", "--short", "-q", "HEAD"], repo)
        base = head.stdout.strip() if head.returncode == 0 else ""
    if not base:
        return "", None
    found = run_git(["rev-parse", "--verify", "-q", f"{base}:{CARTRIDGE_FILE}"], repo)
    return base, (found.stdout.strip() or None) if found.returncode == 0 else None


def committed_note(base: str, blob: str | None, working: Cartridge) -> str | None:
    """One line when workflows do not run under the checkout's file as committed
    (``committed_blob``'s ``base`` and ``blob``): which file they run under, and
    why; None when the checkout's file is the committed one."""
    if not base or blob == working.source_sha:
        return None
    if blob is None:
        return (
            f"{CARTRIDGE_FILE} is not committed on {base}: workflows run under the checkout's "
            "file, which an unconfined agent could edit; commit it"
        )
    return (
        f"{CARTRIDGE_FILE} in the checkout differs from the one committed on {base}; "
        "workflows run under the committed one (commit your edits to use them)"
    )


def load_committed_cartridge(repo: Path) -> tuple[Cartridge, str | None]:
    """The cartridge workflows run under: ``phasegate.toml`` as committed on the base
    branch (``committed_blob``), never edits in a checkout that no one committed
    (docs/trust.md).

    Returns ``(cartridge, note)``: ``committed_note``'s line, None when the
    checkout's file is the committed one. The checkout's file is used when the
    base has none (a new repository's first run). Raises CartridgeError naming
    the file (``BASE:phasegate.toml`` for the committed one) and the key.
    """
    working = load_cartridge(repo)
    base, committed = committed_blob(repo, working)
    note = committed_note(base, committed, working)
    if committed is None or note is None:
        return working, note
    where = Path(f"{base}:{CARTRIDGE_FILE}")
    size = run_git(["cat-file", "-s", committed], repo).stdout.strip()
    if not size.isdigit() or int(size) > MAX_TOML_BYTES:
        raise CartridgeError(f"{where}: {size} bytes, more than a TOML file may have")
    try:
        text = git(["cat-file", "blob", committed], repo)
    except GitError as exc:
        raise CartridgeError(f"{where}: cannot read it: {exc}") from None
    try:
        raw = parse_toml(text, str(where))
    except TomlError as exc:
        raise CartridgeError(str(exc)) from None
    return cartridge_from_document(repo, raw, where=where, sha=committed), note
