"""What the tests of the real agent CLIs share (claude-code, codex, mini-swe-agent,
aider, gemini, opencode, ...): a role's TOML bound to a program, the five roles'
scripts, a project whose roles a test binds, a ticket run through the real
``phasegate`` CLI, a workflow shown as JSON, a scripted server that tells a
program to retry at once, and the check that no key was left in the output, the
store or an agent's own files.

The markers are the first words of phasegate's prompt for each role: a scripted
model server tells the roles' requests apart by them.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from phasegate.testing.model_server import ScriptedModelServer, Step

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

__all__ = [
    "BUILD",
    "IN_USD",
    "OUT_USD",
    "PLAN",
    "PLAN_REVIEW",
    "REVIEW",
    "STEP_COST",
    "VERIFY",
    "ROUND_1",
    "ROUND_2",
    "RetryAfterServer",
    "assert_killed_at_timeout",
    "assert_review_resumed",
    "assert_no_keys",
    "make_project",
    "offered_tools",
    "processes_under",
    "role_scripts",
    "role_toml",
    "run_ticket",
    "scripted_servers",
    "show",
    "two_review_rounds",
]

PLAN = "You are planning a change"
PLAN_REVIEW = "Review this implementation plan"
BUILD = "Implement the plan below"
REVIEW = "Review this pull request"
VERIFY = "You are an independent verifier"

IN_USD, OUT_USD = 1.25, 10.0  # per million tokens
STEP_COST = (100 * IN_USD + 20 * OUT_USD) / 1e6  # a scripted step reports 100 + 20 tokens


def role_toml(
    runner: str,
    exe: str,
    *,
    model: str,
    base_url: str,
    timeout: int,
    key_env: str | None = None,
    env: Mapping[str, str] | None = None,
    more: Sequence[str] = (),
    extra: str = "",
) -> str:
    """A ``[roles.X]`` table's lines binding the real program ``exe`` through
    ``runner``: ``model`` at ``base_url``, priced at ``IN_USD``/``OUT_USD``, the
    key in ``key_env`` (``api_key_env``) and ``env`` as the binding's env when
    given, the lines ``more``, ``timeout`` seconds unless ``extra`` (appended last)
    sets its own."""
    lines = [
        f"runner = {json.dumps(runner)}",
        f"executable = {json.dumps(exe)}",
        f"model = {json.dumps(model)}",
        f"base_url = {json.dumps(base_url)}",
        f"input_usd_per_mtok = {IN_USD}",
        f"output_usd_per_mtok = {OUT_USD}",
        *more,
    ]
    if "timeout" not in extra:
        lines.append(f"timeout = {timeout}")
    if key_env is not None:
        lines.append(f"api_key_env = {json.dumps(key_env)}")
    if env:
        lines.append("env = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}")
    return "\n".join(lines) + "\n" + extra


def role_scripts(
    build: Sequence[Step],
    verify: Sequence[Step],
    *,
    review: Sequence[Step] | None = None,
    say: Callable[[str], Step] = lambda text: Step(text=text),
) -> dict[str, list[Step]]:
    """The five roles' scripts of a whole workflow that adds feature.txt: a plan, its
    approval, ``build``, a review approving it (unless ``review``), ``verify``.
    ``say(text)``: a step answering ``text`` in the program's way."""
    return {
        PLAN: [say("1. Create feature.txt containing 'the feature'.")],
        PLAN_REVIEW: [say("The plan is sound.\nVERDICT: approve")],
        BUILD: list(build),
        REVIEW: list(review or [say("Correct and minimal.\nVERDICT: approve")]),
        VERIFY: list(verify),
    }


#: The markers of a review's two rounds (``two_review_rounds``).
ROUND_1, ROUND_2 = f"{REVIEW} (review round 1)", f"{REVIEW} (review round 2)"


def two_review_rounds(
    say: Callable[[str], Step] = lambda text: Step(text=text),
) -> dict[str, list[Step]]:
    """A review that asks for changes, then approves: a whole workflow's second
    development round. Put before the role scripts (a round's marker is the more
    specific)."""
    return {
        ROUND_1: [say("Add a trailing newline test.\nVERDICT: request_changes")],
        ROUND_2: [say("Now fine.\nVERDICT: approve")],
    }


def assert_review_resumed(
    server: ScriptedModelServer, runs: Sequence[Mapping[str, Any]], turns: str = "messages"
) -> None:
    """The second review round resumed the first's session: its one request carried
    the first round's turn again (in the body's ``turns`` list), and both review runs
    (``show``'s agent runs) name one session."""
    round_two = server.played(ROUND_2)
    assert len(round_two) == 1, round_two
    sent = json.dumps(round_two[0].body[turns])
    assert "review round 1" in sent and "Add a trailing newline test." in sent
    reviews = [r for r in runs if r["role"] == "review"]
    assert len(reviews) == 2 and reviews[0]["session_id"] == reviews[1]["session_id"], reviews


class RetryAfterServer(ScriptedModelServer):
    """The scripted server, its error answers (5xx) carrying ``retry_header: 0``: a
    program that waits what an answer says retries at once, not after its own
    backoff. Its JSON answers keep the connection open for the retry."""

    def __init__(self, scripts: Mapping[str, Sequence[Step]], retry_header: str) -> None:
        super().__init__(scripts)
        self.retry_header = retry_header

    def _json(self, handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        if status >= 500:
            handler.send_header(self.retry_header, "0")
        # The connection stays open: a program retrying at once may reuse it, and Bun's
        # fetch (opencode's) reported a socket closed under it instead of the status.
        handler.end_headers()
        handler.wfile.write(data)


def scripted_servers(retry_header: str) -> Any:
    """A fixture ``servers``: ``servers(scripts)`` starts a ``RetryAfterServer``
    saying ``retry_header``, stopped after the test."""

    @pytest.fixture
    def servers() -> Iterator[Callable[[Mapping[str, Sequence[Step]]], ScriptedModelServer]]:
        started: list[ScriptedModelServer] = []

        def start(scripts: Mapping[str, Sequence[Step]]) -> ScriptedModelServer:
            server = RetryAfterServer(scripts, retry_header).start()
            started.append(server)
            return server

        yield start
        for server in started:
            server.stop()

    return servers


def offered_tools(server: ScriptedModelServer, marker: str) -> set[str]:
    """The names of the tools the program offered the model in ``marker``'s requests
    (OpenAI's chat shape)."""
    return {
        tool["function"]["name"]
        for request in server.played(marker)
        for tool in request.body.get("tools", [])
    }


def make_project(
    tmp_path: Path,
    roles: Mapping[str, str],
    *,
    extra: str = "",
    files: Mapping[str, str] | None = None,
) -> Path:
    """A repository at ``tmp_path/repo`` with ``files`` besides a README, whose
    cartridge binds ``roles`` (role → a ``[roles.X]`` table's lines; the others
    scripted, from ``answers.toml``), appends ``extra`` and checks that
    ``feature.txt`` exists; committed."""
    repo = make_repo(
        tmp_path / "repo",
        {
            "README.md": "# r\n",
            ".gitignore": ".phasegate/\n",
            "answers.toml": HAPPY_ANSWERS,
            **(files or {}),
        },
    )
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=["test -f feature.txt"], role_overrides=dict(roles), extra=extra)
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def run_ticket(
    repo: Path, env: Mapping[str, str], *, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``phasegate run --json "Add feature.txt"`` in ``repo`` with ``env`` added to
    the environment (the keys a test hands phasegate, named by a binding or not)."""
    return phasegate_cli(
        "run", "--repo", str(repo), "--json", "Add feature.txt", timeout=timeout, env=dict(env)
    )


def show(repo: Path, workflow_id: str) -> dict:
    """``phasegate show ID --json``, parsed; fails the test when it fails."""
    out = phasegate_cli("show", workflow_id, "--repo", str(repo), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


#: Seconds past its timeout a hung call may take to be killed and recorded: the kill of
#: its process group, on a loaded machine.
KILL_GRACE_S = 15.0


def assert_killed_at_timeout(runs: Iterable[Mapping[str, Any]], extra: str) -> None:
    """Each of ``runs`` (agent runs as ``show`` lists them) ended as a timeout and
    lasted at most ``KILL_GRACE_S`` past the ``timeout = N`` of its binding's
    ``extra``: phasegate cut the hang; it did not wait it out."""
    found = re.search(r"timeout = (\d+)", extra)
    assert found, f"no timeout in {extra!r}"
    runs = list(runs)
    assert runs
    for run in runs:
        assert run["error_kind"] == "timeout", run
        assert run["duration_s"] <= int(found.group(1)) + KILL_GRACE_S, run


def assert_no_keys(
    repo: Path, keys: Iterable[str], *outputs: str, dirs: Iterable[Path] = ()
) -> None:
    """None of ``keys`` in ``outputs``, in the store's file (its bytes and its SQL
    dump) or in any file under ``dirs`` (an agent's own sessions and settings)."""
    db = repo / ".phasegate" / "state.db"
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    files = [p for d in dirs for p in Path(d).rglob("*") if p.is_file()]
    for key in keys:
        for text in outputs:
            assert key not in text
        assert key.encode() not in db.read_bytes()
        assert key not in dump
        for path in files:
            assert key.encode() not in path.read_bytes(), path


def assert_output_streamed(repo: Path, workflow_id: str, roles: Iterable[str]) -> None:
    """What the program printed while each of ``roles`` ran reached the workflow's
    live stream: ``agent_output`` rows naming that role, with text (the dashboard
    and ``phasegate events --follow`` show them as they come)."""
    with sqlite3.connect(repo / ".phasegate" / "state.db") as conn:
        rows = conn.execute(
            "SELECT data FROM events WHERE workflow_id = ? AND type = 'agent_output'",
            (workflow_id,),
        ).fetchall()
    texts: dict[str, str] = {}
    for (data,) in rows:
        row = json.loads(data)
        texts[row["role"]] = texts.get(row["role"], "") + row["text"]
    missing = [role for role in roles if not texts.get(role, "").strip()]
    assert not missing, f"no live output from {missing}; rows from {sorted(texts)}"


def processes_under(root: Path) -> list[int]:
    """The pids of the processes whose working directory lies under ``root``: what
    an agent left running (none, once phasegate killed its process group)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(proc.joinpath("cwd").resolve()).startswith(str(root)):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids
