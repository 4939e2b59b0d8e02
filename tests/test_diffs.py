"""A workflow's change wherever it is (phasegate.changes): `phasegate diff` and the
dashboard's diff page read the branch while it exists, the merge commit once
merged (its branch deleted), the clone that built it, and say what to fetch when
none has it. The page tints whole lines with +/- markers, lists the files and
folds each one.

Real parts: real git repositories and the local forge, scripted agents, the
console script's app, the dashboard through TestClient.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from phasegate.changes import workflow_change
from phasegate.git.diffs import parse_diff
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app
from phasegate.web.auth import SESSION_COOKIE, Person, Role

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

TOKEN = "web-token-for-diffs-tests-0123456789"

#: A plan, a build that adds one file and changes another, approvals.
ANSWERS = """
[[plan]]
text = "1. Write feature.txt, say so in the README"
[[plan_review]]
text = "VERDICT: approve"
[[build]]
text = "wrote feature.txt"
[build.files]
"feature.txt" = "the feature\\nits second line\\n"
"README.md" = "# sample, with a feature\\n"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""


def _repo(path: Path, *, auto_merge: bool, extra: str = "") -> Path:
    repo = make_repo(path, {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=auto_merge, extra=extra))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def _branch_gone(repo: Path, branch: str) -> None:
    """Delete ``branch`` from ``repo``, the workflow's worktree holding it first."""
    listing = git(repo, "worktree", "list", "--porcelain").split("\n\n")
    for entry in listing:
        if f"branch refs/heads/{branch}" in entry:
            git(repo, "worktree", "remove", "--force", entry.split("\n")[0].split(" ", 1)[1])
    if git(repo, "branch", "--list", branch):
        git(repo, "branch", "-D", branch)
    assert git(repo, "branch", "--list", branch) == ""


def test_a_merged_workflow_s_diff_is_its_merge_commit_after_its_branch_is_deleted(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = _repo(tmp_path / "repo", auto_merge=True)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "completed"
    row = store.workflow_row(workflow_id)
    assert row["merge_sha"]
    _branch_gone(repo, row["branch_name"])
    # Something else lands on main afterwards: the merge's diff must not carry it.
    (repo / "later.txt").write_text("landed after\n")
    git(repo, "add", "later.txt")
    git(repo, "commit", "-q", "-m", "later")

    shown = phasegate_cli("diff", workflow_id, "--repo", str(repo))
    assert shown.returncode == 0, shown.stderr
    assert "+the feature" in shown.stdout and "+its second line" in shown.stdout
    assert "-# sample\n+# sample, with a feature\n" in shown.stdout
    assert "later.txt" not in shown.stdout
    assert "\x1b[" not in shown.stdout  # piped: plain, a patch git applies
    assert f"merge commit {row['merge_sha'][:12]}" in shown.stderr

    stat = phasegate_cli("diff", workflow_id, "--stat", "--repo", str(repo))
    assert stat.returncode == 0, stat.stderr
    lines = stat.stdout.splitlines()
    assert re.fullmatch(r"feature\.txt\s+\+2 -0\s+added", lines[1]), lines
    assert re.fullmatch(r"README\.md\s+\+1 -1", lines[0]), lines
    assert lines[-1] == "2 files changed, +3 -1"

    as_json = phasegate_cli("diff", workflow_id, "--json", "--repo", str(repo))
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["missing"] is None and data["source"].startswith("merge commit")
    by_path = {f["path"]: f for f in data["files"]}
    assert by_path["feature.txt"]["status"] == "added"
    assert (data["added"], data["removed"]) == (3, 1)
    added = [ln for ln in by_path["feature.txt"]["lines"] if ln["kind"] == "add"]
    assert [(ln["new"], ln["text"]) for ln in added] == [(1, "the feature"), (2, "its second line")]

    # The diff page shows the same change, not "the branch is gone".
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        client.get(f"/login?token={TOKEN}")
        page = client.get(f"/workflows/{workflow_id}/diff").text
    assert 'id="diff-missing"' not in page
    assert 'data-path="feature.txt" data-status="added"' in page


def test_a_workflow_of_another_clone_is_read_where_it_was_built_and_what_to_fetch_is_said(
    tmp_path: Path,
) -> None:
    store_file = tmp_path / "shared.db"
    built = _repo(
        tmp_path / "built", auto_merge=False, extra=f'[store]\nurl = "sqlite:///{store_file}"\n'
    )
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(built), str(other))
    ran = phasegate_cli("run", "Add the feature", "--repo", str(built))
    assert ran.returncode == 0, ran.stderr
    status = json.loads(phasegate_cli("status", "--json", "--repo", str(other)).stdout)
    (row,) = status
    workflow_id = row["id"]
    assert row["status"] == "waiting"
    branch = row["branch_name"]
    assert git(other, "branch", "--list", branch) == ""  # the other clone never had it

    shown = phasegate_cli("diff", workflow_id, "--stat", "--repo", str(other))
    assert shown.returncode == 0, shown.stderr
    assert "feature.txt" in shown.stdout and f"branch {branch} against main" in shown.stderr
    # Read in place: nothing was fetched into the other clone.
    assert git(other, "for-each-ref", "refs/phasegate/fetched") == ""

    # Gone from the clone that built it and never pushed: no diff, and what to do.
    _branch_gone(built, branch)
    missing = phasegate_cli("diff", workflow_id, "--repo", str(other))
    assert missing.returncode == 1 and missing.stdout == ""
    assert f"the branch {branch} is not in {other}" in missing.stderr
    assert "git fetch" in missing.stderr
    as_json = phasegate_cli("diff", workflow_id, "--json", "--repo", str(other))
    assert as_json.returncode == 1
    failed = json.loads(as_json.stdout)
    # The error every command prints under --json, and what it is about.
    assert failed["error"]["kind"] == "ChangeMissing"
    assert branch in failed["error"]["message"] and branch in failed["missing"]
    assert failed["workflow"] == workflow_id


def test_the_piped_diff_is_a_patch_git_applies(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = _repo(tmp_path / "repo", auto_merge=False)
    engine, _store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    # A real process with its stdout a pipe, as `phasegate diff ID > p.diff` has it.
    piped = phasegate_cli("diff", workflow_id, "--repo", str(repo), cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.endswith("\n") and not piped.stdout.endswith("\n\n")
    patch = tmp_path / "p.diff"
    patch.write_text(piped.stdout)
    base = tmp_path / "base"
    git(tmp_path, "clone", "-q", "--branch", "main", str(repo), str(base))
    git(base, "apply", "--check", str(patch))  # raises on "corrupt patch"
    git(base, "apply", str(patch))
    assert (base / "feature.txt").read_text() == "the feature\nits second line\n"


def test_json_with_stat_lists_the_files_without_their_lines(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = _repo(tmp_path / "repo", auto_merge=False)
    engine, _store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    stat = phasegate_cli("diff", workflow_id, "--json", "--stat", "--repo", str(repo))
    assert stat.returncode == 0, stat.stderr
    files = json.loads(stat.stdout)["files"]
    assert {f["path"]: f["added"] for f in files} == {"feature.txt": 2, "README.md": 1}
    assert all("lines" not in f for f in files)


def test_a_branch_only_on_origin_is_fetched_into_phasegate_s_refs_never_a_person_s(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = _repo(tmp_path / "repo", auto_merge=False)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    branch = store.workflow_row(workflow_id)["branch_name"]
    # The branch lives on origin only (pushed there, then gone from here).
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main", branch)
    _branch_gone(repo, branch)
    before = git(repo, "for-each-ref", "refs/heads", "refs/remotes")

    change = workflow_change(engine, workflow_id)
    assert change.missing is None, change.missing
    assert [f.path for f in change.files] == ["README.md", "feature.txt"]
    assert git(repo, "for-each-ref", "refs/heads", "refs/remotes") == before
    assert git(repo, "rev-parse", f"refs/phasegate/fetched/{branch}")


# -- the page ----------------------------------------------------------------------


@pytest.fixture
def waiting(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> Iterator[tuple[TestClient, Access, str]]:
    """A dashboard and a workflow waiting for its merge approval."""
    repo = _repo(tmp_path / "repo", auto_merge=False)
    engine, _store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    access = Access(token=TOKEN, user="alice")
    with TestClient(create_app(engine, access)) as client:
        yield client, access, workflow_id


def test_the_diff_page_tints_whole_lines_with_markers_lists_files_and_folds_each(
    waiting: tuple[TestClient, Access, str],
) -> None:
    client, _access, workflow_id = waiting
    client.get(f"/login?token={TOKEN}")
    page = client.get(f"/workflows/{workflow_id}/diff").text
    # The file list: each path with its counts and (when not modified) its status.
    files = re.search(r'<nav class="diff-summary" id="diff-files".*?</nav>', page, re.S)
    assert files
    rows = re.findall(r'<tr class="diff-file-row" data-path="([^"]+)" data-status="(\w+)">', page)
    assert rows == [("README.md", "modified"), ("feature.txt", "added")]
    assert 'id="diff-added">+3</span>' in page and 'id="diff-removed">&minus;1</span>' in page
    # One <details> a file, open: it folds without script.
    folds = re.findall(
        r'<details class="diff-file" id="diff-file-\d" data-path="([^"]+)" open>', page
    )
    assert folds == ["README.md", "feature.txt"]
    # Each line its marker, in a cell of its tinted row.
    assert re.search(
        r'<tr class="diff-line diff-add" data-path="feature.txt" data-new="1">.*?'
        r'<td class="marker" aria-hidden="true">\+</td>',
        page,
        re.S,
    )
    assert re.search(
        r'<tr class="diff-line diff-del" data-path="README.md" data-new="">.*?'
        r'<td class="marker" aria-hidden="true">\u2212</td>',
        page,
        re.S,
    )
    # The tint is the row's: pygments' background no longer covers the code cell.
    assert "table.diff tr.diff-add td { background:" in client.get("/static/dashboard.css").text
    assert not re.search(r"^\.code \{ background", page, re.M)
    # A person who decides may comment on a line.
    assert 'id="comment-form"' in page and 'class="comment-on"' in page


def test_a_viewer_sees_the_diff_without_the_comment_forms(
    waiting: tuple[TestClient, Access, str],
) -> None:
    client, access, workflow_id = waiting
    session = access.open_session(Person("vera", Role.VIEWER))
    client.cookies.set(SESSION_COOKIE, session.id)
    page = client.get(f"/workflows/{workflow_id}/diff").text
    assert 'data-path="feature.txt"' in page and "diff-add" in page
    for form in ('id="comment-form"', 'id="review-form"', 'class="comment-on"'):
        assert form not in page


def test_parse_diff_reads_renames_deletions_and_the_no_newline_note(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {"a.txt": "one\ntwo\nthree\nfour\n", "gone.txt": "bye\n"})
    git(repo, "checkout", "-q", "-b", "change")
    git(repo, "mv", "a.txt", "b.txt")
    git(repo, "rm", "-q", "gone.txt")
    (repo / "b.txt").write_text("one\ntwo\nthree\nfour")  # the last newline gone
    git(repo, "commit", "-qam", "change")
    from phasegate.git.diffs import branch_diff

    files = {f.path: f for f in parse_diff(branch_diff(repo, "main", "change"))}
    assert files["b.txt"].status == "renamed" and files["b.txt"].old_path == "a.txt"
    assert files["gone.txt"].status == "deleted" and files["gone.txt"].removed == 1
    changed = [(ln.kind, ln.text) for ln in files["b.txt"].lines if ln.kind in ("add", "del")]
    assert changed == [("del", "four"), ("add", "four")]


def test_a_rebased_merge_is_the_branch_s_commits_in_a_row_counted_from_its_recorded_head(
    tmp_path: Path,
) -> None:
    from phasegate.config.cartridge import load_cartridge
    from phasegate.store import open_store
    from phasegate.store import tables as t
    from phasegate.testing import InMemoryForge

    forge = '[forge]\nkind = "github"\nrepository = "octo/widgets"\nmerge_method = "rebase"\n'
    repo = _repo(tmp_path / "repo", auto_merge=False, extra=forge)
    git(repo, "checkout", "-q", "-b", "feature")
    head = ""
    for name in ("one.txt", "two.txt"):
        (repo / name).write_text(f"{name}\n")
        git(repo, "add", name)
        git(repo, "commit", "-q", "-m", name)
        head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    (repo / "base.txt").write_text("the base moved\n")
    git(repo, "add", "base.txt")
    git(repo, "commit", "-q", "-m", "base moved")
    # What the forge's rebase merge does: the branch's commits replayed on the base.
    git(repo, "cherry-pick", f"{head}~1", head)
    merged = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "branch", "-q", "-D", "feature")

    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store, forge=InMemoryForge())
        workflow_id = store.create_workflow(
            title="t",
            ticket="x",
            repo_path=str(repo),
            base_branch="main",
            auto_merge=False,
            content_language="en",
        )
        with store.transaction() as conn:
            conn.execute(
                t.workflows.update()
                .where(t.workflows.c.id == workflow_id)
                .values(branch_name="feature", merge_sha=merged, state={"head_sha": head})
            )
        change = workflow_change(engine, workflow_id)
        assert change.missing is None, change.missing
        assert change.source == f"merge commit {merged[:12]} (rebased: 2 commits)"
        assert [f.path for f in change.files] == ["one.txt", "two.txt"]  # base.txt not
        # Without the recorded head here: the last commit alone, and it says so.
        with store.transaction() as conn:
            conn.execute(
                t.workflows.update()
                .where(t.workflows.c.id == workflow_id)
                .values(state={"head_sha": "0" * 40})
            )
        change = workflow_change(engine, workflow_id)
        assert [f.path for f in change.files] == ["two.txt"]
        assert "its last commit only" in change.source
    finally:
        store.close()


def test_on_a_terminal_the_diff_is_colored_and_an_agent_s_control_characters_are_shown(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    import os
    import pty
    import subprocess
    import sys

    repo = _repo(tmp_path / "repo", auto_merge=False)
    answers = (repo / "answers.toml").read_text()
    (repo / "answers.toml").write_text(
        answers.replace('"the feature\\n', '"the feature\\u001b[2J\\n', 1)
    )
    git(repo, "commit", "-qam", "an answer that clears the screen")
    engine, _store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"

    main, child = pty.openpty()
    exe = Path(sys.executable).parent / "phasegate"
    proc = subprocess.run(
        [str(exe), "diff", workflow_id, "--repo", str(repo)],
        stdout=child,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal's other end is closed: all was read
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.returncode == 0, proc.stderr
    text = out.decode()
    assert "\x1b[32m+the feature\\x1b[2J\x1b[0m" in text  # green, the escape shown not sent
    assert "\x1b[31m-# sample\x1b[0m" in text
    assert "\x1b[2J" not in text
