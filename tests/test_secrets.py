"""Secrets out of every record, raw and encoded (issue 10, item 4)."""

from __future__ import annotations

import base64
import time
from urllib.parse import quote

import pytest

from phasegate.redaction import files_with_secrets, holds_secret, redact, secret_variants

SENTINEL = "sk-sentinel-9f3b2c7d1e"


def _encodings(secret: str) -> dict[str, str]:
    raw = secret.encode()
    return {
        "raw": secret,
        "reversed": secret[::-1],
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
        "url": quote(secret + "/?&", safe=""),
        "b64": base64.b64encode(raw).decode(),
        "b64-nopad": base64.b64encode(raw).decode().rstrip("="),
        "urlsafe": base64.urlsafe_b64encode(b"\xfb\xff" + raw).decode(),
    }


@pytest.mark.parametrize("how", sorted(_encodings(SENTINEL)))
def test_redact_hides_the_secret_in_each_encoding(how: str) -> None:
    secret = SENTINEL + "/?&" if how == "url" else SENTINEL
    text = f"before {_encodings(SENTINEL)[how]} after"

    out = redact(text, [secret])

    assert "***" in out and out.startswith("before ") and out.endswith(" after")
    assert not holds_secret(out, [secret])


@pytest.mark.parametrize("lead", range(6))
def test_base64_of_the_secret_inside_longer_base64_is_found_at_every_alignment(lead: int) -> None:
    blob = base64.b64encode(b"x" * lead + f"key={SENTINEL};".encode() + b"tail").decode()
    urlsafe = base64.urlsafe_b64encode(base64.b64decode(blob)).decode()
    for encoded in (blob, blob.rstrip("="), urlsafe):
        out = redact(encoded, [SENTINEL])
        assert "***" in out
        # What is left cannot be decoded back to the secret: at most 2 edge characters stay.
        for core in secret_variants(SENTINEL):
            assert core not in out


def test_short_values_and_ordinary_text_are_left_alone() -> None:
    text = "the quick brown fox " + base64.b64encode(b"ordinary words here").decode()
    assert redact(text, ["short", SENTINEL]) == text


def test_a_secret_containing_another_is_replaced_whole() -> None:
    inner = "abcdefgh1234"
    outer = f"zz-{inner}-zz99"
    assert redact(f"[{outer}]", [inner, outer]) == "[***]"


def test_files_with_secrets_names_the_files_never_the_value() -> None:
    hexed = SENTINEL.encode().hex()
    b64 = base64.b64encode(SENTINEL.encode()).decode()
    diff = (
        "diff --git a/clean.txt b/clean.txt\n+++ b/clean.txt\n+nothing\n"
        f"diff --git a/conf/k.txt b/conf/k.txt\n+++ b/conf/k.txt\n+k = {hexed}\n"
        f"diff --git a/b.b64 b/b.b64\n+++ b/b.b64\n+{b64}\n"
    )
    assert files_with_secrets(diff, [SENTINEL]) == ["conf/k.txt", "b.b64"]
    assert files_with_secrets(diff.replace(hexed, "x"), ["other-secret-value"]) == []


def test_redacting_a_megabyte_with_a_set_of_secrets_is_fast() -> None:
    secrets = [f"sk-live-{i:04d}-abcdefghijkl" for i in range(20)]
    text = ("lorem ipsum dolor sit amet 0123456789abcdef " * 24_000) + secrets[7]
    redact("warm", secrets)  # the pattern is compiled once per secret set

    started = time.perf_counter()
    for _ in range(3):
        out = redact(text, secrets)
    per_call = (time.perf_counter() - started) / 3

    assert out.endswith("***")
    assert per_call < 1.0, f"{per_call:.2f} s per MB"
