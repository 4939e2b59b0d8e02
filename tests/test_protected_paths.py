"""What no agent may change unattended: protected paths and violations hold the merge.

Each test runs the real ``phasegate`` CLI on a real git repository under the
``full-auto`` profile, whose merges otherwise go unattended.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasegate.git.protected import check_files, links_out, protected_patterns, protected_touched
from phasegate.git.workspace import Workspace

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge

#: HAPPY_ANSWERS' build writes feature.txt; a test's build adds its own files after it.
FEATURE_FILE = '"feature.txt" = "the feature\\n"\n'

#: What a hostile build writes into the cartridge: every role unconfined, checks that pass.
LOWERED_BAR = 'checks = [\\"true\\"]\\nsandbox = \\"none\\"\\n'


def project(tmp_path: Path, edits: dict[str, str], *, checks: list[str] | None = None) -> Path:
    """A repository under full-auto whose build writes feature.txt and ``edits``."""
    files = {
        "README.md": "# sample\n",
        ".gitignore": ".phasegate/\n",
        ".github/workflows/ci.yml": "on: push\n",
        "check.sh": "exit 0\n",
        "Makefile": "test:\n\ttrue\n",
    }
    repo = make_repo(tmp_path / "repo", files)
    extra = "".join(f'"{path}" = "{text}"\n' for path, text in edits.items())
    assert FEATURE_FILE in HAPPY_ANSWERS
    (repo / "answers.toml").write_text(HAPPY_ANSWERS.replace(FEATURE_FILE, FEATURE_FILE + extra))
    cartridge = scripted_cartridge(
        auto_merge=None, profile="full-auto", checks=checks or ["sh check.sh"]
    )
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def run(repo: Path, *args: str) -> dict:
    proc = phasegate_cli(*args, "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("edits", "checks", "held"),
    [
        ({"phasegate.toml": LOWERED_BAR}, None, ["phasegate.toml"]),
        ({".github/workflows/ci.yml": "on: never\\n"}, None, [".github/workflows/ci.yml"]),
        ({"check.sh": "exit 0 # tests skipped\\n"}, None, ["check.sh"]),
        ({"Makefile": "test:\\n\\ttrue # nothing\\n"}, ["make test"], ["Makefile"]),
    ],
    ids=["cartridge", "ci-file", "check-script", "makefile-target"],
)
def test_a_change_to_a_protected_path_waits_for_a_person_then_lands_on_approval(
    tmp_path: Path, edits: dict[str, str], checks: list[str] | None, held: list[str]
) -> None:
    repo = project(tmp_path, edits, checks=checks)
    main_before = git(repo, "rev-parse", "main")

    summary = run(repo, "run", "a ticket")

    assert summary["status"] == "waiting", summary
    assert git(repo, "rev-parse", "main") == main_before  # nothing landed unattended
    detail = run(repo, "show", summary["id"])
    hold = detail["merge_hold"]
    assert hold["protected"] == held
    assert all(f"+++ b/{path}" in hold["diff"] for path in held)
    assert "feature.txt" not in hold["diff"]  # the diff of the protected files alone
    shown = phasegate_cli("show", summary["id"], "--repo", str(repo)).stdout
    assert "merge held for a person: the change touches protected paths: " + held[0] in shown
    assert f"phasegate approve-merge {summary['id']}" in shown

    # A worker passing by does not merge it either.
    phasegate_cli("worker", "--once", "--repo", str(repo))
    assert git(repo, "rev-parse", "main") == main_before

    approved = run(repo, "approve-merge", summary["id"], "--by", "alice")
    assert approved["status"] == "completed", approved
    assert git(repo, "show", f"main:{held[0]}").strip()  # the person's decision landed it
    milestones = run(repo, "show", summary["id"])["milestones"]
    approval = [m for m in milestones if m["kind"] == "merge_approved"][-1]
    assert approval["summary"] == "alice"
    assert approval["data"]["held"].startswith("merge held for a person")


def test_a_change_outside_the_protected_paths_still_merges_unattended(tmp_path: Path) -> None:
    repo = project(tmp_path, {})

    summary = run(repo, "run", "a ticket")

    assert summary["status"] == "completed", summary
    assert git(repo, "show", "main:feature.txt") == "the feature"


def test_a_later_workflow_runs_under_the_committed_cartridge_not_an_edited_one(
    tmp_path: Path,
) -> None:
    repo = project(tmp_path, {})
    committed = git(repo, "rev-parse", "main:phasegate.toml")
    # An edit no one committed (an unconfined agent's, say) that would fail every check.
    edited = (repo / "phasegate.toml").read_text().replace('"sh check.sh"', '"exit 1"')
    (repo / "phasegate.toml").write_text(edited)

    proc = phasegate_cli("run", "a ticket", "--repo", str(repo), "--json")

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "differs from the one committed on main" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed"  # the committed checks ran, not `exit 1`
    assert summary["cartridge_sha"] == committed
    checks = [m for m in run(repo, "show", summary["id"])["milestones"] if m["kind"] == "tests_run"]
    assert [c["command"] for c in checks[-1]["data"]["checks"]] == ["sh check.sh"]


def test_a_symlink_out_of_the_repository_holds_the_merge(tmp_path: Path) -> None:
    repo = project(tmp_path, {})
    build = (
        'runner = "command"\n'
        'command = "echo feature > feature.txt && ln -s /etc/passwd passwd && ln -s . d && '
        'ln -s d/d/d/d/../../../../etc/passwd pw && echo built"\n'
        "timeout = 30\n"
    )
    text = (repo / "phasegate.toml").read_text()
    marker = '[roles.build]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'
    assert marker in text
    (repo / "phasegate.toml").write_text(text.replace(marker, "[roles.build]\n" + build))
    git(repo, "commit", "-qam", "a command build")
    main_before = git(repo, "rev-parse", "main")

    summary = run(repo, "run", "a ticket")

    assert summary["status"] == "waiting", summary
    assert git(repo, "rev-parse", "main") == main_before
    detail = run(repo, "show", summary["id"])
    hold = detail["merge_hold"]
    assert hold["protected"] == []
    # The second link's text stays inside; resolved through `d -> .` it climbs out.
    assert [(v["name"], v["paths"]) for v in hold["violations"]] == [
        ("outward_symlink", ["passwd"]),
        ("outward_symlink", ["pw"]),
    ]
    assert "2 violation(s) this round: outward_symlink" in hold["reason"]
    assert [(v["name"], v["paths"]) for v in detail["violations"]] == [
        ("outward_symlink", ["passwd"]),
        ("outward_symlink", ["pw"]),
    ]  # show lists them with the agents' violations


def test_links_out_knows_a_link_that_leaves_the_repository() -> None:
    assert not links_out("docs/up", "../README.md")
    assert not links_out("a/b/c", "../../d/./e")
    assert links_out("docs/out", "../../secret")
    assert links_out("top", "../x")
    assert links_out("abs", "/etc/passwd")
    assert links_out("a/b", "c/../../../x")


def test_the_change_s_entries_give_modes_and_blobs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "checkout", "-qb", "change")
    (repo / "out").symlink_to("/etc/passwd")
    (repo / "README.md").unlink()
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "links")
    workspace = Workspace()

    entries = workspace.change_entries(repo, "main", "change")

    assert [(path, mode, status) for path, mode, _, status in entries] == [
        ("README.md", "000000", "D"),
        ("out", "120000", "A"),
    ]
    assert workspace.blob_text(repo, entries[1][2]) == "/etc/passwd"


def test_check_files_name_what_a_check_runs() -> None:
    changed = {"Makefile", "ci/run.sh", "package.json", "tox.ini", "src/x.py", "pytest.ini"}
    assert check_files(["make test"], changed) == ("Makefile",)
    assert check_files(["bash ./ci/run.sh --fast"], changed) == ("ci/run.sh",)
    assert check_files(["npm test", "tox -e py"], changed) == ("package.json", "tox.ini")
    assert check_files(["python -m pytest -q"], changed) == ("pytest.ini", "tox.ini")
    assert check_files(["SCRIPT=ci/run.sh sh -c 'x'"], changed) == ("ci/run.sh",)
    assert check_files(["sh -c 'bash ci/run.sh'"], changed) == ("ci/run.sh",)
    # The forms a shell reads as the same file, and the directories a tool moves to.
    for command in (
        "sh ci/../ci/run.sh",
        "sh ci//run.sh",
        "sh /repo/ci/run.sh",
        "sh $PWD/ci/run.sh",
        "cd ci && sh run.sh",
        "sh ci/run.sh>/dev/null",
        "sh ci/r*.sh",
    ):
        assert check_files([command], changed, ["/repo"]) == ("ci/run.sh",), command
    assert check_files(["python3 -m ci.check"], {"ci/check.py"}) == ("ci/check.py",)
    assert check_files(["make -C sub test"], {"sub/Makefile"}) == ("sub/Makefile",)
    assert check_files(["cd sub && make test"], {"sub/Makefile"}) == ("sub/Makefile",)
    assert check_files(["npm --prefix web test"], {"web/package.json"}) == ("web/package.json",)
    pytest_config = {"pyproject.toml", "setup.cfg", "tests/conftest.py", "tests/test_a.py"}
    assert check_files(["python -m pytest -q"], pytest_config) == (
        "pyproject.toml",
        "setup.cfg",
        "tests/conftest.py",
    )
    assert check_files(["sh /elsewhere/ci/run.sh", "cat ../ci/run.sh"], changed, ["/repo"]) == ()
    # A file the change adds is its own, unless a tool reads it as its configuration.
    added = {"feature.txt", "conftest.py"}
    assert check_files(["test -f feature.txt && pytest"], added, tracked=set()) == ("conftest.py",)
    assert check_files(["cargo test", "go test ./..."], changed) == ()
    patterns = protected_patterns(None, ["make test"], changed)
    assert patterns == ("phasegate.toml", ".github/", ".gitlab-ci.yml", ".ci/", "Makefile")
    # A cartridge's own list replaces the defaults; the cartridge file stays protected.
    assert protected_patterns(["deploy/*.yml"], [], changed) == ("phasegate.toml", "deploy/*.yml")
    given = protected_patterns(["./deploy/", "**/secret.cfg"], [], changed)
    assert protected_touched(["deploy/x", "secret.cfg", "a/secret.cfg", "b.cfg"], given) == (
        "a/secret.cfg",
        "deploy/x",
        "secret.cfg",
    )
    touched = protected_touched(
        ["src/x.py", ".github/workflows/a.yml", "deploy/prod.yml", "Makefile"], patterns
    )
    assert touched == (".github/workflows/a.yml", "Makefile")


def test_the_dashboard_shows_the_hold_and_its_diff_and_approves_it(
    tmp_path: Path, engine_for
) -> None:
    from fastapi.testclient import TestClient
    from test_web import TOKEN, logged_in

    from phasegate.web import Access, create_app
    from phasegate.web.auth import CSRF_HEADER

    repo = project(tmp_path, {".github/workflows/ci.yml": "on: never\\n"})
    engine, store = engine_for(repo)
    workflow_id = engine.start("t", "ticket")
    assert engine.advance(workflow_id)["status"] == "waiting"
    with TestClient(create_app(engine, Access(token=TOKEN, user="bob"))) as client:
        csrf = logged_in(client)
        page = client.get(f"/workflows/{workflow_id}").text
        assert "merge held for a person: the change touches protected paths: " in page
        assert 'id="merge-hold-diff"' in page and "+on: never" in page
        assert 'id="approve-merge"' in page
        client.post(f"/workflows/{workflow_id}/approve-merge", headers={CSRF_HEADER: csrf})
    row = engine.advance(workflow_id)
    assert row["status"] == "completed"
    approval = [m for m in store.milestones(workflow_id) if m.kind == "merge_approved"][-1]
    assert approval.summary == "bob"


def test_doctor_says_when_workflows_do_not_run_under_the_checkout_s_cartridge(
    tmp_path: Path,
) -> None:
    repo = project(tmp_path, {})

    def warnings() -> list[str]:
        proc = phasegate_cli("doctor", "--offline", "--json", "--repo", str(repo))
        return [w for w in json.loads(proc.stdout)["warnings"] if "phasegate.toml" in w]

    assert warnings() == []  # the checkout's file is the committed one
    (repo / "phasegate.toml").write_text((repo / "phasegate.toml").read_text() + "\n# edited\n")
    assert warnings() == [
        "phasegate.toml in the checkout differs from the one committed on main; workflows run "
        "under the committed one (commit your edits to use them)"
    ]
    git(repo, "rm", "-q", "--cached", "phasegate.toml")
    git(repo, "commit", "-qm", "the cartridge untracked")
    assert warnings() == [
        "phasegate.toml is not committed on main: workflows run under the checkout's file, "
        "which an unconfined agent could edit; commit it"
    ]


def test_an_approval_stands_only_for_the_change_the_person_saw(tmp_path: Path) -> None:
    repo = project(tmp_path, {})
    text = (
        (repo / "phasegate.toml").read_text().replace('profile = "full-auto"', 'profile = "review"')
    )
    (repo / "phasegate.toml").write_text(text)
    git(repo, "commit", "-qam", "review profile")
    summary = run(repo, "run", "a ticket")
    assert (summary["status"], run(repo, "show", summary["id"])["merge_hold"]) == ("waiting", None)
    main_before = git(repo, "rev-parse", "main")
    # Someone commits a cartridge edit to the branch after the report the person read.
    checkout = repo / ".phasegate" / "worktrees" / summary["id"]
    (checkout / "phasegate.toml").write_text(
        text.replace("check_timeout = 60", "check_timeout = 1")
    )
    git(checkout, "commit", "-qam", "later")

    refused = phasegate_cli("approve-merge", summary["id"], "--by", " ", "--repo", str(repo))
    assert refused.returncode == 2 and "--by needs a name" in refused.stderr
    after = run(repo, "approve-merge", summary["id"], "--by", "alice")

    assert after["status"] == "waiting", after  # the approval did not cover the new commit
    assert git(repo, "rev-parse", "main") == main_before
    assert run(repo, "show", summary["id"])["merge_hold"]["protected"] == ["phasegate.toml"]
    again = run(repo, "approve-merge", summary["id"], "--by", "alice")
    assert again["status"] == "completed", again
    assert "check_timeout = 1" in git(repo, "show", "main:phasegate.toml")
