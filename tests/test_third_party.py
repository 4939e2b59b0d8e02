"""The main job on a repository no one here wrote.

A real third-party project (six 1.16.0, unpacked from its sdist) becomes a git
repository; ``phasegate run`` takes a ticket against it with every role bound
to a ``command`` runner: small Python scripts outside the repository that read
the prompt phasegate sends and answer like agents would. The build agent makes
a real edit (two new functions in six.py and their tests in test_six.py), the
checks are the project's own test suite, and the verifier imports the merged
six and calls the new functions. The workflow must reach completed with the
change merged into ``main`` and six's own tests still passing there.

CI downloads the sdist and exports PHASEGATE_THIRD_PARTY_SDIST; without it the
test downloads it itself, and skips (saying why) when the index is unreachable.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import git, phasegate_cli

pytestmark = pytest.mark.slow

SDIST_ENV = "PHASEGATE_THIRD_PARTY_SDIST"
REQUIREMENT = "six==1.16.0"
ROLES = ("plan", "plan_review", "build", "review", "verification")

TICKET = """# Add six.removeprefix() and six.removesuffix()

Python 3.9 added str.removeprefix() and str.removesuffix() (PEP 616). Code that
still runs on older Pythons cannot call them. Add `six.removeprefix(s, prefix)`
and `six.removesuffix(s, suffix)` that behave like the PEP 616 methods for text
and binary strings on every Python six supports, and test them in test_six.py.

Acceptance: `six.removeprefix("six.moves", "six.") == "moves"`,
`six.removesuffix("test_six.py", ".py") == "test_six"`, an empty affix leaves
the string unchanged, and six's test suite passes.
"""
TITLE = "Add six.removeprefix() and six.removesuffix()"

# -- the agents: plain scripts, each run by phasegate's command runner --------------

PLAN_AGENT = '''
import os, sys
prompt = sys.stdin.read()
assert os.environ["PHASEGATE_ROLE"] == "plan", os.environ["PHASEGATE_ROLE"]
assert "six.removeprefix" in prompt, "the ticket is not in the prompt"
assert os.path.isfile("six.py"), "not run in a checkout of six"
print("""1. In six.py, next to ensure_text(), add removeprefix(s, prefix) and
   removesuffix(s, suffix): return s without the affix when s starts (ends) with
   a non-empty affix, else s unchanged; they work on text and bytes alike.
2. In test_six.py, add test_removeprefix and test_removesuffix covering text,
   bytes, non-ASCII text, a missing affix and an empty affix.
3. Run six's test suite.""")
'''

PLAN_REVIEW_AGENT = """
import sys
prompt = sys.stdin.read()
ok = "removeprefix" in prompt and "test_six.py" in prompt
print("The plan names both functions and their tests." if ok else "The plan misses the tests.")
print("VERDICT: approve" if ok else "VERDICT: revise")
"""

SIX_ADDITION = '''
def removeprefix(s, prefix):
    """Return ``s`` without ``prefix`` when it starts with it, else ``s``.

    The ``str.removeprefix`` of Python 3.9 (PEP 616), for text and binary
    strings on every Python six supports.
    """
    if prefix and s.startswith(prefix):
        return s[len(prefix):]
    return s


def removesuffix(s, suffix):
    """Return ``s`` without ``suffix`` when it ends with it, else ``s``.

    The ``str.removesuffix`` of Python 3.9 (PEP 616), for text and binary
    strings on every Python six supports.
    """
    # An empty suffix must not reach s[:-0], which would be the empty string.
    if suffix and s.endswith(suffix):
        return s[:-len(suffix)]
    return s

'''

TEST_ADDITION = """

def test_removeprefix():
    assert six.removeprefix("six.moves", "six.") == "moves"
    assert six.removeprefix("six.moves", "seven.") == "six.moves"
    assert six.removeprefix("six", "") == "six"
    assert six.removeprefix("", "six") == ""
    assert six.removeprefix(b"\\x00\\x01abc", b"\\x00\\x01") == b"abc"
    assert six.removeprefix(six.u("\\u00e9t\\u00e9"), six.u("\\u00e9")) == six.u("t\\u00e9")


def test_removesuffix():
    assert six.removesuffix("test_six.py", ".py") == "test_six"
    assert six.removesuffix("test_six.py", ".pyc") == "test_six.py"
    assert six.removesuffix("six", "") == "six"
    assert six.removesuffix("", "six") == ""
    assert six.removesuffix(b"abc\\xff", b"\\xff") == b"abc"
    assert six.removesuffix(six.u("t\\u00e9t\\u00e9"), six.u("\\u00e9")) == six.u("t\\u00e9t")
"""

BUILD_AGENT = f"""
import os, pathlib, sys
prompt = sys.stdin.read()
assert os.environ["PHASEGATE_ROLE"] == "build", os.environ["PHASEGATE_ROLE"]
assert os.environ["PHASEGATE_READ_ONLY"] == "0"
# The finalized plan must reach the builder.
assert "## Plan" in prompt and "removesuffix(s, suffix)" in prompt, prompt[-2000:]
root = pathlib.Path.cwd()
six_py, test_py = root / "six.py", root / "test_six.py"
source = six_py.read_text()
anchor = "def python_2_unicode_compatible(klass):"
if "def removeprefix(" not in source:  # a retried build must not add them twice
    if anchor not in source:
        sys.exit("six.py: cannot find python_2_unicode_compatible() to insert before")
    source = source.replace(anchor, {SIX_ADDITION.strip()!r} + "\\n\\n\\n" + anchor, 1)
    six_py.write_text(source)
tests = test_py.read_text()
if "def test_removeprefix(" not in tests:
    test_py.write_text(tests.rstrip("\\n") + "\\n" + {TEST_ADDITION!r})
print("Added six.removeprefix() and six.removesuffix() (PEP 616 backports) with tests.")
"""

REVIEW_AGENT = """
import os, subprocess, sys
prompt = sys.stdin.read()
assert os.environ["PHASEGATE_READ_ONLY"] == "1"
# Read the branch itself, not only the diff in the prompt.
changed = subprocess.run(["git", "diff", "--name-only", "main...HEAD"], capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
problems = []
if sorted(changed) != ["six.py", "test_six.py"]:
    problems.append("unexpected files changed: %s" % changed)
if "+def removeprefix(" not in prompt or "+def test_removesuffix(" not in prompt:
    problems.append("the diff in the prompt lacks the functions or their tests")
print("\\n".join(problems) or "Both functions match PEP 616 and are tested.")
print("VERDICT: request_changes" if problems else "VERDICT: approve")
"""

VERIFY_AGENT = """
import os, sys
prompt = sys.stdin.read()
here = os.path.realpath(os.getcwd())
sys.path.insert(0, here)
sys.dont_write_bytecode = True  # read-only: leave the checkout as it was
import six
problems = []
if os.path.dirname(os.path.realpath(six.__file__)) != here:
    problems.append("imported six from %s, not the merge checkout" % six.__file__)
try:
    cases = [
        (six.removeprefix("six.moves", "six."), "moves"),
        (six.removesuffix("test_six.py", ".py"), "test_six"),
        (six.removeprefix("six", ""), "six"),
        (six.removesuffix("six", ""), "six"),
        (six.removeprefix(b"abc", b"a"), b"bc"),
    ]
    problems += ["got %r, expected %r" % case for case in cases if case[0] != case[1]]
except AttributeError as exc:
    problems.append("missing: %s" % exc)
if "FAILED" in prompt:
    problems.append("a check failed on the merge commit")
print("\\n".join(problems) or "six.removeprefix/removesuffix behave as PEP 616 says.")
print("VERDICT: rejected" if problems else "VERDICT: confirmed")
"""

# Appended to the build agent for the retry test: its first attempt also adds a
# test that fails the checks; told so, the second attempt takes it out again.
BROKEN_FIRST_ATTEMPT = """
tests = test_py.read_text()
broken = "\\n\\ndef test_removeprefix_keeps_the_prefix():\\n"
if os.environ["PHASEGATE_CALL_INDEX"] == "0":
    test_py.write_text(tests + broken + "    assert six.removeprefix('ab', 'a') == 'ab'\\n")
else:
    assert "The checks failed on your last attempt" in prompt, prompt[-2000:]
    test_py.write_text(tests.split(broken)[0].rstrip("\\n") + "\\n")
"""

AGENTS = {
    "plan": PLAN_AGENT,
    "plan_review": PLAN_REVIEW_AGENT,
    "build": BUILD_AGENT,
    "review": REVIEW_AGENT,
    "verification": VERIFY_AGENT,
}

# -- helpers ------------------------------------------------------------------------


def _sdist(tmp_path: Path) -> Path:
    """six's sdist: the file CI downloaded, or one downloaded now, or skip."""
    given = os.environ.get(SDIST_ENV)
    if given:
        path = Path(given)
        # CI said where it is: a missing file is a broken CI, not a reason to skip.
        assert path.is_file(), f"{SDIST_ENV}={given} does not exist"
        return path
    dest = tmp_path / "sdist"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--no-binary",
        ":all:",
        "-d",
        str(dest),
        REQUIREMENT,
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{SDIST_ENV} unset and `pip download {REQUIREMENT}` timed out")
    found = sorted(dest.glob("six-*.tar.gz"))
    if proc.returncode != 0 or not found:
        pytest.skip(
            f"{SDIST_ENV} unset and `pip download {REQUIREMENT}` failed "
            f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    return found[0]


def _unpack(sdist: Path, dest: Path) -> Path:
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Pythons before the extraction filters
            tar.extractall(dest)  # noqa: S202 - a known sdist from the package index
    [root] = [p for p in dest.iterdir() if p.is_dir()]
    return root


def _test_command(*, pytest_cache: bool = False) -> list[str]:
    """six's own suite, minus what this Python cannot run (and without .pytest_cache).

    test_move_items imports every stdlib module six.moves names. It skips
    tkinter, gdbm and winreg when they are absent, but not dbm.ndbm, which
    Python builds without libndbm lack; only then is that one case deselected.
    """
    command = [sys.executable, "-m", "pytest", "-q", "test_six.py"]
    if not pytest_cache:
        command[3:3] = ["-p", "no:cacheprovider"]
    try:
        import dbm.ndbm  # noqa: F401
    except ImportError:
        command += ["--deselect", "test_six.py::test_move_items[dbm_ndbm]"]
    return command


def _run_suite(repo: Path, ref: str, where: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """six's test suite in a fresh detached worktree of ``ref``; the worktree is removed."""
    git(repo, "worktree", "add", "-q", "--detach", str(where), ref)
    try:
        return subprocess.run(
            [*_test_command(), *extra],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    finally:
        git(repo, "worktree", "remove", "--force", str(where))


def _passed(proc: subprocess.CompletedProcess[str]) -> int:
    """How many tests pytest's final line says passed."""
    found = re.search(r"(\d+) passed", proc.stdout.strip().splitlines()[-1])
    assert found, proc.stdout[-1000:]
    return int(found.group(1))


def _cartridge(agents: Path, *, max_dev_retries: int = 0, pytest_cache: bool = False) -> str:
    def quoted(value: str) -> str:
        return json.dumps(value)  # a JSON string is a valid TOML basic string

    def command(role: str) -> str:
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(agents / f'{role}.py'))}"

    roles = "".join(
        f'[roles.{role}]\nrunner = "command"\ncommand = {quoted(command(role))}\ntimeout = 120\n\n'
        for role in ROLES
    )
    return (
        "[workflow]\n"
        'base_branch = "main"\n'
        "auto_merge = false  # the run turns it on with --auto-merge\n\n"
        f"[limits]\nagent_retries = 0\nmax_dev_retries = {max_dev_retries}\n\n"
        "[landing_areas]\n"
        f"checks = [{quoted(shlex.join(_test_command(pytest_cache=pytest_cache)))}]\n"
        "check_timeout = 300\n\n" + roles
    )


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
        f"{proc.stderr[-6000:]}"
    )
    return json.loads(proc.stdout)


def _six_repo(tmp_path: Path) -> Path:
    """six, unpacked from its sdist, committed as ``main`` of a new git repository."""
    repo = _unpack(_sdist(tmp_path), tmp_path / "src")
    assert (repo / "six.py").is_file() and (repo / "test_six.py").is_file()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{repo.name} from its sdist")
    return repo


def _write_agents(tmp_path: Path, build_extra: str = "") -> Path:
    """The agent scripts, in a directory outside the repository."""
    agents = tmp_path / "agents"
    agents.mkdir()
    for role, source in AGENTS.items():
        if role == "build":
            source = textwrap.dedent(source) + textwrap.dedent(build_extra)
        (agents / f"{role}.py").write_text(textwrap.dedent(source).lstrip())
    return agents


def _run_ticket(repo: Path, tmp_path: Path) -> dict[str, Any]:
    """``phasegate run --ticket --auto-merge --json`` on ``repo``; its JSON summary."""
    ticket = tmp_path / "TICKET.md"
    ticket.write_text(TICKET)
    return _json(
        phasegate_cli(
            "run",
            "--repo",
            str(repo),
            "--ticket",
            str(ticket),
            "--auto-merge",
            "--json",
            timeout=900,
        )
    )


def _approve_held(repo: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The check names test_six.py, so the agent's new tests in it are a protected
    path's change: the merge waits for a person, who approves it; the summary after."""
    assert (summary["current_phase"], summary["status"]) == ("wait", "waiting"), summary
    detail = _json(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json", timeout=60))
    assert detail["merge_hold"]["protected"] == ["test_six.py"], detail["merge_hold"]
    return _json(
        phasegate_cli(
            "approve-merge",
            summary["id"],
            "--by",
            "maintainer",
            "--repo",
            str(repo),
            "--json",
            timeout=900,
        )
    )


# -- the tests ----------------------------------------------------------------------


def test_run_a_ticket_on_six_to_completed(tmp_path: Path) -> None:
    repo = _six_repo(tmp_path)
    original = git(repo, "rev-parse", "main")

    # The project's suite is green before phasegate touches anything, and the
    # functions the ticket asks for do not exist yet.
    before = _run_suite(repo, "main", tmp_path / "before")
    assert before.returncode == 0, before.stdout[-4000:] + before.stderr[-2000:]
    assert "def removeprefix(" not in (repo / "six.py").read_text()

    # `phasegate init` as a user would (it also keeps .phasegate/ out of git),
    # then the cartridge bound to our agents; left uncommitted, as a user might.
    init = phasegate_cli("init", "--repo", str(repo), timeout=60)
    assert init.returncode == 0, init.stderr
    (repo / "phasegate.toml").write_text(_cartridge(_write_agents(tmp_path)))

    summary = _approve_held(repo, _run_ticket(repo, tmp_path))
    assert original == git(repo, "rev-parse", "main^1")  # nothing landed before the approval
    assert (summary["current_phase"], summary["status"]) == ("completed", "completed"), summary
    assert summary["title"] == TITLE
    assert summary["error"] is None

    [row] = _json(phasegate_cli("status", "--json", "--repo", str(repo), timeout=60))
    assert row["id"] == summary["id"] and row["status"] == "completed"
    detail = _json(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json", timeout=60))
    # Every role ran once, as a command, and answered on its first try.
    runs = detail["agent_runs"]
    assert sorted(r["role"] for r in runs) == sorted(ROLES), runs
    assert all(r["runner"] == "command" and r["outcome"] == "ok" for r in runs), runs
    [tests_run] = [m for m in detail["milestones"] if m["kind"] == "tests_run"]
    assert tests_run["status"] == "completed" and tests_run["data"]["passed"] is True
    [verified] = [m for m in detail["milestones"] if m["kind"] == "acceptance_verification"]
    assert verified["data"]["verdict"] == "confirmed"
    assert all(c["passed"] for c in verified["data"]["checks"])

    # main is the merge of the branch into the original commit, and touches
    # exactly the two files the builder edited.
    assert git(repo, "rev-parse", "main") == summary["merge_sha"]
    assert git(repo, "rev-parse", "main^1") == original
    assert sorted(git(repo, "diff", "--name-only", "main^1", "main").splitlines()) == [
        "six.py",
        "test_six.py",
    ]
    merged_six = git(repo, "show", "main:six.py")
    assert "def removeprefix(s, prefix):" in merged_six
    assert "def removesuffix(s, suffix):" in merged_six
    assert "def test_removesuffix():" in git(repo, "show", "main:test_six.py")

    # six's own suite passes on the merged main, new tests included.
    after = _run_suite(repo, "main", tmp_path / "after", "-rA")
    assert after.returncode == 0, after.stdout[-4000:] + after.stderr[-2000:]
    assert "PASSED test_six.py::test_removeprefix" in after.stdout, after.stdout[-4000:]
    assert "PASSED test_six.py::test_removesuffix" in after.stdout, after.stdout[-4000:]
    assert _passed(after) == _passed(before) + 2, (before.stdout[-300:], after.stdout[-300:])

    # The new functions work when imported from the merged main, outside phasegate.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import six; print(six.removeprefix('six.moves', 'six.'), "
            "six.removesuffix(b'x.py', b'.py'))",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert probe.returncode == 0 and probe.stdout.split() == ["moves", "b'x'"], probe

    # The user's checkout of main moved with the merge and holds no stray
    # change; only their own cartridge is untracked. The branch is gone.
    assert git(repo, "status", "--porcelain") == "?? phasegate.toml"
    assert git(repo, "branch", "--list", "phasegate/*") == ""


def test_a_retried_build_does_not_commit_what_the_checks_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """six has no .gitignore: the checks' bytecode and .pytest_cache are untracked files.

    The first build attempt fails the checks; the second one's commit must
    hold the agent's edit only, not what the first attempt's checks wrote.
    """
    # Let the checks write bytecode, as Python does by default.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    repo = _six_repo(tmp_path)
    init = phasegate_cli("init", "--repo", str(repo), timeout=60)
    assert init.returncode == 0, init.stderr
    agents = _write_agents(tmp_path, build_extra=BROKEN_FIRST_ATTEMPT)
    cartridge = _cartridge(agents, max_dev_retries=1, pytest_cache=True)
    (repo / "phasegate.toml").write_text(cartridge)

    summary = _approve_held(repo, _run_ticket(repo, tmp_path))
    assert summary["status"] == "completed", summary

    detail = _json(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json", timeout=60))
    attempts = [
        (m["attempt"], m["status"]) for m in detail["milestones"] if m["kind"] == "tests_run"
    ]
    assert attempts == [(1, "failed"), (2, "completed")], attempts
    # One review round: the reviewer found only six.py and test_six.py on the branch.
    assert [r["role"] for r in detail["agent_runs"]].count("review") == 1

    tree = git(repo, "ls-tree", "-r", "--name-only", "main").splitlines()
    assert not [p for p in tree if "__pycache__" in p or ".pytest_cache" in p or p.endswith(".pyc")]
    assert sorted(git(repo, "diff", "--name-only", "main^1", "main").splitlines()) == [
        "six.py",
        "test_six.py",
    ]
    assert "test_removeprefix_keeps_the_prefix" not in git(repo, "show", "main:test_six.py")
    after = _run_suite(repo, "main", tmp_path / "after")
    assert after.returncode == 0, after.stdout[-4000:]
