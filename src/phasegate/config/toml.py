"""Reading a TOML file someone else wrote: the cartridge, scripted answers, a dry-run
script, a repository's pyproject.toml.

``read_toml`` turns every way such a file can be bad — missing, not UTF-8, too
big, not TOML, nested deeper than any real configuration (a "TOML bomb" that
makes ``tomllib`` exhaust Python's stack) — into one ``TomlError`` whose
message names the file and, for nesting, the key.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from phasegate.core.contract import PhasegateError

__all__ = ["MAX_TOML_BYTES", "MAX_TOML_DEPTH", "TomlError", "parse_toml", "read_toml"]

#: Bytes a file may have: a cartridge is a few KiB; scripted answers may carry patches.
MAX_TOML_BYTES = 4 * 1024 * 1024
#: Tables and arrays within one another: a real cartridge nests four deep.
MAX_TOML_DEPTH = 32


class TomlError(PhasegateError):
    """The file cannot be read as TOML; the message starts with its path."""


def read_toml(
    path: Path, *, max_bytes: int = MAX_TOML_BYTES, max_depth: int = MAX_TOML_DEPTH
) -> dict[str, Any]:
    """The document in ``path`` as a dict. Raises TomlError (file, size in bytes,
    decoding, syntax, or nesting over ``max_depth`` naming the key where it does)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise TomlError(f"{path}: {size} bytes, more than the {max_bytes} a TOML file may have")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise TomlError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TomlError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return parse_toml(text, str(path), max_depth=max_depth)


def parse_toml(text: str, where: str, *, max_depth: int = MAX_TOML_DEPTH) -> dict[str, Any]:
    """The document ``text`` as a dict; ``where`` names it in a TomlError (syntax,
    or nesting over ``max_depth`` naming the key where it does)."""
    path = where
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        where = _deep_line(text, max_depth)
        raise TomlError(f"{path}: {where}nested more than {max_depth} levels deep") from None
    deep = _too_deep(document, max_depth)
    if deep is not None:
        raise TomlError(f"{path}: {deep}: nested more than {max_depth} levels deep")
    return document


def _too_deep(document: dict[str, Any], max_depth: int) -> str | None:
    """The dotted key of the first value nested more than ``max_depth`` deep, else None.
    Iterative: the check itself must not recurse as deep as the document does."""
    stack: list[tuple[Any, str, int]] = [(document, "", 0)]
    while stack:
        value, key, depth = stack.pop()
        if depth > max_depth:
            parts = key.split(".")
            return ".".join(parts[:6]) + (".…" if len(parts) > 6 else "") or "(top level)"
        if isinstance(value, dict):
            stack.extend((v, f"{key}.{k}" if key else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{key}[{i}]", depth + 1) for i, v in enumerate(value))
    return None


_TABLE = re.compile(r"^\s*\[\[?([^\[\]]+)\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"' ]+?)\s*=")


def _deep_line(text: str, max_depth: int) -> str:
    """``"line N, key K: "`` where the brackets of ``text`` first nest deeper than
    ``max_depth`` (strings and comments skipped), for a document too deep to parse."""
    depth, table, key, quote = 0, "", "", ""
    for number, line in enumerate(text.splitlines(), start=1):
        if not quote and depth == 0:
            if header := _TABLE.match(line):
                table = header.group(1).strip() + "."
            elif found := _KEY.match(line):
                key = table + found.group(1).strip()
        i = 0
        while i < len(line):
            char = line[i]
            if quote:
                if line.startswith(quote, i) and (quote == "'" or line[i - 1 : i] != "\\"):
                    i += len(quote) - 1
                    quote = ""
            elif char in "\"'":
                quote = char * 3 if line.startswith(char * 3, i) else char
                i += len(quote) - 1
            elif char == "#":
                break
            elif char in "[{":
                depth += 1
                if depth > max_depth:
                    return f"line {number}, key {key or '(top level)'}: "
            elif char in "]}":
                depth = max(depth - 1, 0)
            i += 1
        if len(quote) == 1:
            quote = ""  # a one-line string does not go on to the next line
    return ""
