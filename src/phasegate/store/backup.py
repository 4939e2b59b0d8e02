"""An online backup of a SQLite store: a consistent copy taken while workers write.

SQLite's backup API copies the file's pages in one step inside one read
transaction: in WAL mode that transaction blocks no writer, and the copy is
the store as it was at one commit. It is written beside the target and moved
into place, so a target is never left half-written. A PostgreSQL store is
backed up with the server's own tools (``pg_dump``; docs/operations-at-scale.md).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from phasegate.config.store_url import sqlite_file
from phasegate.core.contract import PhasegateError

__all__ = ["BackupRefused", "PG_DUMP_HINT", "backup_sqlite"]

#: What a PostgreSQL store's owner runs instead (the URL's schema, if any, as --schema).
PG_DUMP_HINT = (
    "a PostgreSQL store is backed up with the server's own tools: "
    "`pg_dump --format=custom --file=phasegate.dump 'postgresql://user@host:5432/db'` "
    "(safe while workers run), restored with `pg_restore --dbname=... phasegate.dump` "
    "(docs/operations-at-scale.md)"
)


class BackupRefused(PhasegateError):
    """The backup was not taken: the target exists (and no ``force``), the store is
    not a SQLite file (PostgreSQL: PG_DUMP_HINT), or there is no store yet."""


def backup_sqlite(url: str, target: Path, *, force: bool = False) -> int:
    """Copy the SQLite store at ``url`` (``store.url``) to ``target`` while workers
    may write; returns the copy's size in bytes. Refuses (BackupRefused) an
    existing ``target`` unless ``force``, a directory or a file in a directory
    that does not exist (each named, with what to do), a PostgreSQL store, an in-memory or
    missing one, and a copy that could not be written (nothing is left at
    ``target`` then)."""
    if url.startswith(("postgresql", "postgres:")):
        raise BackupRefused(f"phasegate backup copies a SQLite store; {PG_DUMP_HINT}")
    path = sqlite_file(url)
    if path is None or path in ("", ":memory:"):
        raise BackupRefused(f"{url} is not a SQLite file to back up")
    source = Path(path)
    if not source.exists():
        raise BackupRefused(f"there is no store at {source} yet: nothing to back up")
    target = target.resolve()
    if target == source.resolve():
        raise BackupRefused(f"{target} is the store itself")
    if target.is_dir():  # before "exists": --force would not help
        raise BackupRefused(
            f"{target} is a directory; give a file to write, e.g. {target / 'phasegate-backup.db'}"
        )
    if not target.parent.is_dir():
        raise BackupRefused(
            f"the directory {target.parent} does not exist; make it first "
            f"(`mkdir -p {target.parent}`) or give a file in one that does"
        )
    if target.exists() and not force:
        raise BackupRefused(f"{target} exists; --force replaces it")
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    reading = sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True, timeout=30)
    try:
        copy = sqlite3.connect(partial)
        try:
            # One step (pages=-1): a copy in steps starts over whenever another
            # connection commits between two, and might never end under busy workers.
            reading.backup(copy, pages=-1)
            copy.execute("PRAGMA journal_mode=DELETE")  # one file, whole by itself
        finally:
            copy.close()
        os.replace(partial, target)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        raise BackupRefused(f"the backup to {target} failed: {exc}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        reading.close()
    return target.stat().st_size
