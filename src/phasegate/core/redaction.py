"""Keeping secret values out of every record: raw and in the encodings a model
can trivially produce.

Pure: no environment, no I/O.

    redact(text, secrets)            # "***" for each value or encoded copy
    files_with_secrets(diff, secrets)  # the paths of a diff that hold one

The variants of a secret set are compiled into one pattern once (cached by
the set), so redacting every record of a workflow costs one regex pass each.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote, quote_plus

__all__ = [
    "MIN_SECRET",
    "SECRET_NAME",
    "secret_set",
    "secrets_in_environment",
    "files_with_secrets",
    "holds_secret",
    "redact",
    "secret_variants",
]

MIN_SECRET = 8  # characters; shorter values would redact ordinary words

#: Variables whose name says they hold a secret (model keys, forge tokens, passwords).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.I)


def _base64_cores(raw: bytes) -> list[str]:
    """The base64 text ``raw`` has inside any longer base64 text: for each of the 3
    alignments (0, 1, 2 bytes before it), the characters its bits alone decide."""
    cores = []
    for lead in range(3):
        encoded = base64.b64encode(bytes(lead) + raw).decode().rstrip("=")
        # A character is 6 bits: the first ceil(8*lead/6) mix in the bytes before,
        # the last partial one mixes in the bytes after.
        start = -(-8 * lead // 6)
        end = (8 * (lead + len(raw))) // 6
        cores.append(encoded[start:end])
    return cores


def secret_variants(secret: str) -> list[str]:
    """The texts that give ``secret`` away: raw, reversed, URL-encoded, hex (lower
    and upper), and base64 (standard and urlsafe, padded or not, at any of the 3
    alignments inside a longer base64 text); deduplicated, longest first."""
    raw = secret.encode("utf-8")
    found = {secret, secret[::-1], quote(secret, safe=""), quote_plus(secret, safe="")}
    found |= {"".join(f"%{b:02X}" for b in raw), "".join(f"%{b:02x}" for b in raw)}
    found |= {raw.hex(), raw.hex().upper()}
    for core in _base64_cores(raw):
        found |= {core, core.translate(_URLSAFE)}
    return sorted((v for v in found if v), key=len, reverse=True)


_URLSAFE = str.maketrans("+/", "-_")


@functools.lru_cache(maxsize=64)
def _pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    # Computed once per secret set: a record, a diff, every answer of a
    # workflow are redacted of the same few values.
    variants = {v for s in secrets if len(s) >= MIN_SECRET for v in secret_variants(s)}
    if not variants:
        return None
    # Longest first: the alternation takes the first that matches at a position,
    # so a secret containing another is replaced whole.
    ordered = sorted(variants, key=lambda v: (-len(v), v))
    return re.compile("|".join(re.escape(v) for v in ordered))


def _compiled(secrets: Iterable[str]) -> re.Pattern[str] | None:
    return _pattern(tuple(sorted(set(secrets))))


# Two or more lines of base64 characters (``base64`` wraps at 76, MIME at 76 with
# CRLF), each perhaps behind a diff's "+", "-" or " ": a secret's base64 split
# over lines is found in the block's lines joined.
_B64_LINE = r"[+\- ]?[A-Za-z0-9+/_=-]{4,}"
_WRAPPED = re.compile(rf"^{_B64_LINE}(?:\r?\n{_B64_LINE})+$", re.MULTILINE)


def _wrapped_blocks(text: str, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """The spans of the wrapped base64 blocks of ``text`` whose joined lines hold
    a secret's variant (with and without a diff's line markers)."""
    if "\n" not in text:
        return []
    spans = []
    for block in _WRAPPED.finditer(text):
        lines = block.group().splitlines()
        bare = "".join(line[1:] if line[:1] in "+- " else line for line in lines)
        if pattern.search("".join(lines)) or pattern.search(bare):
            spans.append(block.span())
    return spans


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value, raw or encoded (``secret_variants``),
    replaced by ``***``; a wrapped base64 block holding one goes whole. Values
    shorter than 8 characters are left alone."""
    pattern = _compiled(secrets)
    if pattern is None or not text:
        return text
    for start, end in reversed(_wrapped_blocks(text, pattern)):
        text = text[:start] + "***" + text[end:]
    return pattern.sub("***", text)


def holds_secret(text: str, secrets: Iterable[str]) -> bool:
    """Whether ``text`` holds any secret value, raw or encoded (``secret_variants``),
    a base64 one wrapped over lines included."""
    pattern = _compiled(secrets)
    if pattern is None:
        return False
    return pattern.search(text) is not None or bool(_wrapped_blocks(text, pattern))


def files_with_secrets(diff: str, secrets: Iterable[str]) -> list[str]:
    """The paths of a unified diff (``git diff``'s, or bare ``---``/``+++`` headers)
    whose section holds a secret value, raw or encoded; a secret before any file
    header names ``-``. Never the value itself."""
    if not holds_secret(diff, secrets):
        return []
    sections: dict[str, list[str]] = {}
    path = "-"
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[-1]
        elif line.startswith(("--- a/", "+++ b/")):
            path = line[6:]
        sections.setdefault(path, []).append(line)
    return [name for name, lines in sections.items() if holds_secret("\n".join(lines), secrets)]


def secret_set(values: Iterable[str]) -> list[str]:
    """The distinct ``values`` long enough to redact (``MIN_SECRET``), longest first,
    so a secret containing another is replaced whole."""
    return sorted({v for v in values if len(v) >= MIN_SECRET}, key=len, reverse=True)


def secrets_in_environment(environ: Mapping[str, str]) -> list[str]:
    """Every value in ``environ`` held by a variable whose name says it is secret
    (``SECRET_NAME``). The caller passes the environment: this module reads none."""
    return secret_set(v for k, v in environ.items() if SECRET_NAME.search(k))
