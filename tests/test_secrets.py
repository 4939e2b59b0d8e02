"""Secrets out of every record, raw and encoded."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from phasegate.core.redaction import files_with_secrets, holds_secret, redact, secret_variants
from phasegate.forge.local import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.phases.attempts import measure_change, refused_change
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import (
    HAPPY_ANSWERS,
    git,
    land_held,
    make_repo,
    phasegate_cli,
    scripted_cartridge,
)

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


# -- a whole workflow: the sentinel keys an agent holds appear nowhere -------------

# A build agent holding two keys its binding names (api_key_env, and a pass_env
# variable whose name says it is secret). Its first call leaks them every way it
# can: answer, stderr, and a change with them raw, base64 and hex; its retry
# writes a clean change but still quotes the keys in its answer.
LEAKY_BUILD = r"""
import base64, os, sys
from pathlib import Path

keys = [os.environ["PG_SENTINEL_KEY"], os.environ["SENTINEL_TOKEN"]]
encoded = []
for key in keys:
    raw = key.encode()
    encoded += [key, key[::-1], raw.hex(), raw.hex().upper(),
                base64.b64encode(raw).decode(), base64.urlsafe_b64encode(b"ab" + raw).decode()]
sys.stdin.read()
print("debug:", " ".join(encoded), file=sys.stderr)
if os.environ["PHASEGATE_CALL_INDEX"] == "0":
    Path("leak.txt").write_text("key = " + keys[0] + "\n")
    Path("leak.b64").write_text(base64.b64encode(("token=" + keys[1]).encode()).decode() + "\n")
    Path("notes.md").write_text("nothing secret here\n")
else:
    Path("feature.txt").write_text("the feature, key read from the environment\n")
print("wrote the change; for the record:", " ".join(encoded))
"""

SENTINEL_KEY = "sk-sentinel-7Qx9Lm2Pz4wR"
SENTINEL_TOKEN = "tok-envtable-55aa66bbCC"


def _needles(secret: str) -> dict[str, bytes]:
    raw = secret.encode()
    b64 = base64.b64encode(raw).decode()
    return {
        "raw": raw,
        "reversed": secret[::-1].encode(),
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        # the characters of the secret's own base64 that no neighbour changes
        "base64": b64[: (len(raw) * 8) // 6].encode(),
        "base64 after 2 bytes": base64.urlsafe_b64encode(b"ab" + raw)[3:-4],
    }


def _found_in(blob: bytes) -> list[str]:
    return [
        f"{secret[:6]}…/{how}"
        for secret in (SENTINEL_KEY, SENTINEL_TOKEN)
        for how, needle in _needles(secret).items()
        if needle in blob or needle.lower() in blob.lower()
    ]


def test_a_leaking_agents_keys_appear_nowhere_in_store_forge_git_or_output(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PG_SENTINEL_KEY", SENTINEL_KEY)
    monkeypatch.setenv("SENTINEL_TOKEN", SENTINEL_TOKEN)
    agent = tmp_path / "leaky_build.py"
    agent.write_text(LEAKY_BUILD)
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    build = (
        f'runner = "command"\ncommand = "{sys.executable} {agent}"\ntimeout = 60\n'
        f'api_key_env = "PG_SENTINEL_KEY"\npass_env = ["SENTINEL_TOKEN"]\n'
    )
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides={"build": build}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine, store = engine_for(repo)

    row = land_held(engine, engine.advance(engine.start("t", "ticket")), "secret_in_change")

    assert row["status"] == "completed", row["error"]
    violations = [e["data"] for e in store.events(row["id"]) if e["type"] == "violation"]
    assert [(v["name"], sorted(v["paths"])) for v in violations] == [
        ("secret_in_change", ["leak.b64", "leak.txt"])
    ]
    rejected = [m for m in store.milestones(row["id"]) if m.kind == "change_rejected"]
    assert len(rejected) == 1 and "leak.b64" in rejected[0].summary
    assert "wrote the change; for the record: ***" in json.dumps(
        [m.data for m in store.milestones(row["id"])]
    )
    forge = LocalForge(store, repo, Workspace())
    (pr,) = forge.pull_requests()
    on_forge = (pr.title + pr.body + json.dumps(forge.comment_rows(), default=str)).encode()
    assert forge.comment_rows() and _found_in(on_forge) == []
    assert git(repo, "show", "main:feature.txt").startswith("the feature")
    assert "leak.txt" not in git(repo, "log", "--all", "--name-only", "--format=")

    shown = [
        phasegate_cli(*args, cwd=repo)
        for args in (("show", row["id"]), ("show", row["id"], "--json"), ("status", "--json"))
    ]
    assert all(s.returncode == 0 for s in shown), [s.stderr for s in shown]
    assert "secret_in_change" in shown[0].stdout and "secret_in_change" in shown[1].stdout
    printed = "".join(s.stdout + s.stderr for s in shown).encode()
    history = subprocess.run(
        ["git", "log", "-p", "--all"], cwd=repo, capture_output=True, check=True
    ).stdout
    # every object git holds, reachable or not (an agent's blob that a reset dropped)
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    store.close()
    stored = b"".join(f.read_bytes() for f in (repo / ".phasegate").rglob("*") if f.is_file())
    assert b"wrote the change" in stored  # the store was read, WAL included
    assert {
        "store": _found_in(stored),
        "output": _found_in(printed),
        "git log -p --all": _found_in(history),
        "git objects": _found_in(objects),
    } == {"store": [], "output": [], "git log -p --all": [], "git objects": []}


def test_a_secret_inside_a_binary_file_of_the_change_is_found(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    start = git(repo, "rev-parse", "HEAD")
    (repo / "data.bin").write_bytes(b"\0\1\2" + base64.b64encode(SENTINEL.encode()) + b"\0")
    (repo / "clean.bin").write_bytes(b"\0\1\2 nothing here \0")

    change = measure_change(repo, start, start, limit=1_000_000)
    refused = refused_change(change, 1_000_000, [SENTINEL], repo)

    assert "Binary files" in (change.diff or "") and set(change.binary) == {"data.bin", "clean.bin"}
    assert refused is not None and (refused.name, refused.paths) == (
        "secret_in_change",
        ("data.bin",),
    )
    assert SENTINEL not in refused.detail


def test_a_graph_build_diff_holding_a_base64_key_is_refused_before_it_is_a_proposal(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_graph_workflow import ANSWERS, FEATURE, graph_repo

    monkeypatch.setenv("SERVICE_API_KEY", SENTINEL)
    encoded = base64.b64encode(f"token={SENTINEL}".encode()).decode()
    leaky = (
        "Adds config.\n\n```diff\n--- /dev/null\n+++ b/config.txt\n@@ -0,0 +1 @@\n"
        f"+{encoded}\n```\n"
    )
    answers = ANSWERS.replace(
        f"[[build]]\ntext = '''{FEATURE}'''",
        f"[[build]]\ntext = '''{leaky}'''\n[[build]]\ntext = '''{FEATURE}'''",
    )
    assert answers.count("[[build]]") == 2
    repo = graph_repo(tmp_path, answers=answers)
    engine, store = engine_for(repo)

    row = land_held(engine, engine.advance(engine.start("t", "ticket")), "secret_in_change")

    assert row["status"] == "completed", row["error"]
    violations = [e["data"] for e in store.events(row["id"]) if e["type"] == "violation"]
    assert [(v["name"], v["paths"]) for v in violations] == [("secret_in_change", ["config.txt"])]
    runs = [r["error_kind"] for r in store.agent_runs(row["id"]) if r["role"] == "build"]
    assert runs == ["secret_in_change", None]
    assert git(repo, "show", "main:feature.txt") == "the feature"
    store.close()
    stored = b"".join(f.read_bytes() for f in (repo / ".phasegate").rglob("*") if f.is_file())
    assert encoded[4:-4].encode() not in stored and SENTINEL.encode() not in stored


def test_base64_wrapped_over_lines_as_the_base64_tool_writes_it_is_found() -> None:
    long_key = "sk-ant-api03-" + "Zq8Lw2Xv9Rt4Yp6Mn1Bc3Kd5Hf7Jg0" * 3  # 103 characters
    wrapped = subprocess.run(
        ["base64"], input=f"ANTHROPIC_API_KEY={long_key}\n".encode(), capture_output=True
    ).stdout.decode()
    assert wrapped.count("\n") >= 2  # wrapped at 76 columns
    diff = "diff --git a/k.b64 b/k.b64\n+++ b/k.b64\n" + "".join(
        "+" + line + "\n" for line in wrapped.splitlines()
    )

    out = redact(f"the key:\n{wrapped}(end)", [long_key])

    assert out == "the key:\n***\n(end)"
    assert not holds_secret(out, [long_key])
    assert files_with_secrets(diff, [long_key]) == ["k.b64"]
    assert files_with_secrets(diff, ["some-other-secret"]) == []
