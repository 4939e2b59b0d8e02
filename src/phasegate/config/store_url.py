"""What ``status`` reads of the checkout's cartridge without validating it: where the
store is (``[store] url`` resolved against the repository) and the text's git blob id.

``status`` only looks, so it should not pay for building the cartridge's models
(``Cartridge.store_url`` resolves the same way, once the file is valid).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from phasegate.config.toml import TomlError, read_toml

#: The cartridge's file, at the repository's root.
CARTRIDGE_FILE = "phasegate.toml"


def blob_sha(data: bytes) -> str:
    """``data``'s git blob id, as ``git hash-object`` computes it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def checkout_cartridge_sha(repo: Path) -> str | None:
    """The git blob id of the checkout's ``phasegate.toml``; None without one."""
    try:
        return blob_sha((repo / CARTRIDGE_FILE).read_bytes())
    except OSError:
        return None


def sqlite_file(url: str) -> str | None:
    """The file of a ``sqlite:///path[?query]`` URL (relative, or absolute with a
    fourth slash); None for another URL or an in-memory database (no path, or
    ``:memory:``)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").partition("?")[0]
    return None if path in ("", ":memory:") else path


def resolve_store_url(repo: Path, url: str | None) -> str:
    """``url``, or the embedded default: SQLite at ``repo/.phasegate/state.db``. A
    relative SQLite path is the repository's (``repo``), wherever the command runs."""
    if url is None:
        return f"sqlite:///{repo / '.phasegate' / 'state.db'}"
    if url.startswith("sqlite:///"):
        path, mark, query = url.removeprefix("sqlite:///").partition("?")
        return f"sqlite:///{repo / path}{mark}{query}"  # an absolute path stays itself
    return url


def checkout_store_url(repo: Path) -> str | None:
    """The store the checkout's ``phasegate.toml`` names: a SQLite file (the default
    one without the file or the key) or a PostgreSQL server's URL as written; None
    where only the validated cartridge can say: a file that is not TOML, a value
    that is neither."""
    path = repo / CARTRIDGE_FILE
    if not path.exists():
        return resolve_store_url(repo, None)
    try:
        store = read_toml(path).get("store", {})
    except TomlError:
        return None
    if not isinstance(store, dict):
        return None
    url = store.get("url")
    if url is None:
        return resolve_store_url(repo, None)
    if isinstance(url, str) and url.startswith(("postgresql://", "postgres://")):
        return url
    if not isinstance(url, str) or sqlite_file(url) is None:
        return None
    return resolve_store_url(repo, url)
