"""Input of any size: prompts reach the agent whole however
late it reads them; a change or an answer above its cartridge limit is refused
with its size named and never stored whole."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.agents.runners.command import CommandRunner
from phasegate.agents.service import answer_limit_of, oversized_answer
from phasegate.config.cartridge import Cartridge, RoleBinding
from phasegate.phases.attempts import measure_change, refused_change
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import HAPPY_ANSWERS, git, make_repo, scripted_cartridge

# Sleeps before it reads a byte, so phasegate must keep writing stdin while it
# waits (a 200 KiB prompt is 3 pipe buffers); keeps what it read and the prompt
# file, and answers with the sha256 of what it read.
SLOW_READER = r"""
import hashlib, os, shutil, sys, time
from pathlib import Path
out = Path(sys.argv[1])
time.sleep(2)
data = sys.stdin.buffer.read()
(out / "stdin.bin").write_bytes(data)
shutil.copy(os.environ["PHASEGATE_PROMPT_FILE"], out / "prompt-file.bin")
(out / "env-prompt.txt").write_text(str("PHASEGATE_PROMPT" in os.environ))
print("1. Write feature.txt")
print("stdin sha256:", hashlib.sha256(data).hexdigest())
"""


def _repo(tmp_path: Path, overrides: dict[str, str], extra: str = "") -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides=overrides, extra=extra))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def _command(script: Path, *args: str, timeout: int = 60) -> str:
    line = " ".join([sys.executable, str(script), *args])
    return f'runner = "command"\ncommand = "{line}"\ntimeout = {timeout}\n'


def test_a_200_kib_ticket_reaches_an_agent_that_reads_its_stdin_late_whole(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    agent = tmp_path / "slow_reader.py"
    agent.write_text(SLOW_READER)
    seen = tmp_path / "seen"
    seen.mkdir()
    repo = _repo(tmp_path, {"plan": _command(agent, str(seen))})
    ticket = "".join(f"line {i:06d} of a long ticket, ünïcödé 语\n" for i in range(5_000))
    assert len(ticket.encode()) > 200 * 1024
    engine, store = engine_for(repo)

    row = engine.advance(engine.start("big ticket", ticket))

    assert row["status"] == "completed", row["error"]
    stdin = (seen / "stdin.bin").read_bytes()
    assert ticket.encode() in stdin
    assert stdin == (seen / "prompt-file.bin").read_bytes()
    # over 100,000 bytes: the prompt is on stdin and in the file, not in the environment
    assert (seen / "env-prompt.txt").read_text() == "False"
    digest = hashlib.sha256(stdin).hexdigest()
    recorded = json.dumps([m.data for m in store.milestones(row["id"])])
    assert f"stdin sha256: {digest}" in recorded


def test_a_prompt_of_many_multibyte_characters_still_starts_the_command(tmp_path: Path) -> None:
    # 45,000 characters are 135,000 bytes in UTF-8: over Linux's 128 KiB for one
    # environment string, which a count of characters let through (E2BIG).
    prompt = "语" * 45_000
    binding = RoleBinding(
        runner="command",
        command='python3 -c "import os, sys; d = sys.stdin.read(); '
        "print(len(d), 'PHASEGATE_PROMPT' in os.environ)\"",
        timeout=30,
    )
    request = AgentRequest(
        workflow_id="w",
        phase="planning",
        role="plan",
        session_line="main",
        prompt=prompt,
        cwd=tmp_path,
        timeout_s=30,
        read_only=True,
    )

    result = CommandRunner(binding).run(request, threading.Event())

    assert (result.error_kind, result.text.split()) == (None, ["45000", "False"]), result.error


def test_an_answer_over_max_answer_bytes_fails_the_call_and_is_never_stored_whole(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    agent = tmp_path / "chatty.py"
    agent.write_text("import sys\nsys.stdin.read()\nprint('1. plan ' + 'blah ' * 600_000)\n")
    repo = _repo(
        tmp_path,
        {"plan": _command(agent)},
        extra="[limits]\nagent_retries = 0\nmax_answer_bytes = 1000000\n",
    )
    engine, store = engine_for(repo)

    row = engine.advance(engine.start("t", "ticket"))

    assert (row["current_phase"], row["status"]) == ("planning", "failed")
    assert "oversized: the answer is 3000009 bytes > limit 1000000" in row["error"]
    (run,) = [r for r in store.agent_runs(row["id"]) if r["role"] == "plan"]
    assert run["error_kind"] == "oversized"
    events = [e["data"] for e in store.events(row["id"]) if e["type"] == "violation"]
    assert [(v["name"], v["role"]) for v in events] == [("oversized", "plan")]
    store.close()
    stored = sum(f.stat().st_size for f in (repo / ".phasegate").glob("state.db*"))
    assert stored < 1_000_000, stored


# Runs one workflow to its end in a process of its own, so its peak memory
# (and its git children's) is its own to measure.
WORKER = r"""
import json, resource, sys
from pathlib import Path
from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
repo = Path(sys.argv[1])
cartridge = load_cartridge(repo)
store = open_store(cartridge.store_url(repo))
engine = Engine(repo, cartridge, store)
row = engine.advance(engine.start("t", "ticket"))
store.close()
print(json.dumps({
    "id": row["id"], "phase": row["current_phase"], "status": row["status"],
    "error": row["error"],
    "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}))
"""

BIG_WRITER = r"""
import sys
sys.stdin.read()
with open("big.txt", "w") as out:
    for i in range(500_000):
        out.write(f"{i:09d} " + "x" * 90 + "\n")
print("wrote big.txt")
"""


def test_a_50_mb_change_is_refused_with_its_size_named_and_never_stored(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    agent = tmp_path / "big_writer.py"
    agent.write_text(BIG_WRITER)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    repo = _repo(
        tmp_path,
        {"build": _command(agent, timeout=120)},
        extra="[limits]\nmax_dev_retries = 0\n",
    )
    base = git(repo, "rev-parse", "main")

    done = subprocess.run(
        [sys.executable, str(worker), str(repo)], capture_output=True, text=True, timeout=600
    )

    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.splitlines()[-1])
    # the figure to compare with: 733 MB for the same change accepted, before the limit
    print(f"peak RSS: worker {row['self_kib'] // 1024} MiB, git {row['children_kib'] // 1024} MiB")
    print(row["phase"], row["status"], row["error"])
    assert row["status"] != "completed", row
    assert git(repo, "rev-parse", "main") == base
    assert "big.txt" not in git(repo, "log", "--all", "--name-only", "--format=")
    _, store = engine_for(repo)
    rejected = [m for m in store.milestones(row["id"]) if m.kind == "change_rejected"]
    assert rejected, row
    # the file is 50,000,000 bytes; its diff adds a "+" a line and the headers
    summary = rejected[0].summary
    assert re.search(r"oversized: the change is 51\d{6} bytes > limit 5000000 ", summary), summary
    discarded = [m for m in store.milestones(row["id"]) if m.kind == "attempt_discarded"]
    assert discarded and all(m.data["diff"] == "" for m in discarded)
    assert discarded[0].data["diff_bytes"] > 50_000_000 and discarded[0].data["paths"] == [
        "big.txt"
    ]
    events = [e["data"] for e in store.events(row["id"]) if e["type"] == "violation"]
    assert events and {(v["name"], tuple(v["paths"])) for v in events} == {
        ("oversized", ("big.txt",))
    }
    store.close()
    stored = sum(f.stat().st_size for f in (repo / ".phasegate").glob("state.db*"))
    assert stored < 1_000_000, stored
    # The same change accepted cost 733 MB before the limit; refused, 72-108 MiB here, but
    # full CI runs measured 303, 401 and 605 MiB for the worker (not understood yet, not
    # reproduced alone or under CPU load): the bound is what must never come back, the
    # change held in memory whole, as many times over as before the limit.
    assert row["self_kib"] < 700 * 1024, row


def test_a_binary_file_counts_with_its_bytes_not_gits_one_line(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    start = git(repo, "rev-parse", "HEAD")
    (repo / "blob.bin").write_bytes(b"\0" + bytes(range(256)) * 24_000)  # 6 MB, binary to git
    (repo / "small.txt").write_text("a line\n")

    change = measure_change(repo, start, start, limit=5_000_000)
    refused = refused_change(change, 5_000_000, [], repo)

    assert change.binary == ("blob.bin",) and change.size > 6_000_000
    assert refused is not None and refused.name == "oversized"
    assert refused.paths == ("blob.bin", "small.txt")
    within = measure_change(repo, start, start, limit=10_000_000)
    assert within.diff is not None and refused_change(within, 10_000_000, [], repo) is None


def test_the_graphs_build_answering_with_a_diff_is_held_to_max_diff_bytes() -> None:
    cartridge = Cartridge.model_validate(
        {"limits": {"max_answer_bytes": 1_000, "max_diff_bytes": 50_000}}
    )
    diff = AgentResult("+" + "x" * 20_000)

    assert answer_limit_of(cartridge, "build", read_only=True) == 50_000
    assert answer_limit_of(cartridge, "build", read_only=False) == 1_000
    assert oversized_answer(diff, 50_000) is diff
    refused = oversized_answer(diff, 1_000)
    assert (refused.error_kind, refused.violations[0].name) == ("oversized", "oversized")
    assert "20001 bytes > limit 1000" in (refused.error or "")
    assert len(refused.text) < 2_100 and refused.text.endswith("...]")
