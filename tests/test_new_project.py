"""`phasegate run --new-project` (preparation makes the forge's repository first:
docs/contracts/lifecycle.md, preparation): the repository made once, with its
first commit, before the issue; found again after a kill; someone else's never
adopted.

GitHub is the fake behind Prism (conftest's ``github``); the CLI is the real
console script; git is real on both sides.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from phasegate.config.forge import ForgeSettings
from phasegate.forge import ForgeAuth, GitHubForge, forge_auth
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.testing import CRASH_EXIT_CODE
from phasegate.tools import new_project as projects

from conftest import HAPPY_ANSWERS, GitHubLab, git, make_repo, phasegate_cli, scripted_cartridge

TICKET = "Write feature.txt"
Build = Callable[..., tuple[Engine, Store]]


def template(lab: GitHubLab | None, tmp_path: Path) -> Path:
    """A directory holding only the cartridge a new project copies: scripted roles
    (answers by absolute path: the new checkout has no answers.toml), the whole
    workflow with auto_merge, and the lab's GitHub without forge.repository."""
    where = tmp_path / "template"
    where.mkdir()
    answers = tmp_path / "answers.toml"
    answers.write_text(HAPPY_ANSWERS)
    forge = ""
    if lab is not None:
        forge = f'[forge]\nkind = "github"\nbase_url = "{lab.api_url}"\npoll_s = 0.2\n'
    (where / "phasegate.toml").write_text(scripted_cartridge(str(answers), extra=forge))
    return where


def new_project(where: Path, checkout: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return phasegate_cli(
        "run", "--new-project", "gadgets", "--dir", str(checkout), "-C", str(where), *extra, TICKET
    )


def milestones(checkout: Path, kind: str) -> list[tuple[str, str]]:
    with sqlite3.connect(checkout / ".phasegate" / "state.db") as db:
        rows = db.execute("SELECT status, data FROM milestones WHERE kind = ?", (kind,))
        return list(rows.fetchall())


def repo_posts(lab: GitHubLab) -> list[int]:
    return [r.status for r in lab.server.requests if (r.method, r.path) == ("POST", "/user/repos")]


def test_a_new_project_on_github_is_made_once_with_its_first_commit_then_a_whole_workflow(
    github: GitHubLab, tmp_path: Path
) -> None:
    checkout = tmp_path / "gadgets"
    done = new_project(template(github, tmp_path), checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "new project phasegate-bot/gadgets" in done.stdout

    gh, name = github.server, "phasegate-bot/gadgets"
    assert repo_posts(github) == [201]
    made = gh.repo(name)
    assert made.private and "made by phasegate for workflow" in (made.description or "")
    # GitHub's history starts at the checkout's first commit, which holds the cartridge
    first = git(checkout, "rev-list", "--max-parents=0", "main")
    assert made.git.git("rev-list", "--max-parents=0", "main").strip() == first
    assert "phasegate.toml" in git(checkout, "show", "--name-only", "--format=", first)
    assert f'repository = "{name}"' in (checkout / "phasegate.toml").read_text()
    assert git(checkout, "remote", "get-url", "origin") == gh.shapes.clone_url(made)
    # then the normal workflow on it: one issue, one PR, merged, the issue closed
    counts = gh.counts(name)
    assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
    assert gh.issue(name, 1).state == "closed"
    assert [status for status, _ in milestones(checkout, "repo_setup")] == ["completed"]


def test_a_kill_right_after_the_repository_is_made_then_a_rerun_finds_it_and_goes_on(
    github: GitHubLab, tmp_path: Path
) -> None:
    where, checkout = template(github, tmp_path), tmp_path / "gadgets"
    # A worker that dies (os._exit, like SIGKILL) the moment GitHub made the repository,
    # before repo_setup is settled and before the first commit is pushed.
    crash = (
        "import sys; from pathlib import Path\n"
        "from phasegate.tools import new_project as p\n"
        "from phasegate.config.cartridge import load_cartridge\n"
        "from phasegate.runtime.engine import Engine\n"
        "from phasegate.forge import make_forge\n"
        "from phasegate.store import open_store\n"
        "from phasegate.testing import CrashingForge\n"
        "from phasegate.git.workspace import Workspace\n"
        "project = p.resolve('gadgets', Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "root = p.make_checkout(project); c = load_cartridge(root)\n"
        "store, ws = open_store(c.store_url(root)), Workspace()\n"
        "forge = CrashingForge(make_forge(c, root, store, ws, []), 'create_repository')\n"
        "engine = Engine(root, c, store, forge=forge, workspace=ws)\n"
        f"wf = engine.start('t', {TICKET!r}, state={{'new_project': project.state()}})\n"
        "engine.advance(wf)\n"
    )
    died = subprocess.run(
        [sys.executable, "-c", crash, str(checkout), str(where)], capture_output=True, text=True
    )
    assert died.returncode == CRASH_EXIT_CODE, died.stderr
    name = "phasegate-bot/gadgets"
    assert github.server.repo(name).git.git("for-each-ref").strip() == ""  # empty: not pushed
    assert [status for status, _ in milestones(checkout, "repo_setup")] == ["in_progress"]

    again = new_project(where, checkout)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "continued" in again.stdout
    assert repo_posts(github) == [201]  # one repository: found, not made (nor 422) again
    first = git(checkout, "rev-list", "--max-parents=0", "main")
    assert github.server.repo(name).git.git("rev-list", "--max-parents=0", "main").strip() == first
    counts = github.server.counts(name)
    assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
    (status, data), *more = milestones(checkout, "repo_setup")
    assert status == "completed" and not more and '"repository": "phasegate-bot/gadgets"' in data


def test_a_name_someone_else_holds_is_refused_and_nothing_is_made(
    github: GitHubLab, tmp_path: Path
) -> None:
    github.server.create_repo("phasegate-bot", "gadgets", auto_init=True, description="theirs")
    checkout = tmp_path / "gadgets"
    refused = new_project(template(github, tmp_path), checkout)
    assert refused.returncode == 2
    said = " ".join(refused.stderr.split())
    assert "phasegate-bot/gadgets already exists on GitHub and is not this project's" in said
    assert not checkout.exists()
    assert repo_posts(github) == []
    assert github.server.counts("phasegate-bot/gadgets")["issues"] == 0
    assert github.server.repo("phasegate-bot/gadgets").description == "theirs"


def test_a_new_project_on_the_local_forge_is_a_new_local_repository(tmp_path: Path) -> None:
    checkout = tmp_path / "gadgets"
    done = new_project(template(None, tmp_path), checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "new project a local repository" in done.stdout
    first = git(checkout, "rev-list", "--max-parents=0", "main")
    assert "phasegate.toml" in git(checkout, "show", "--name-only", "--format=", first)
    assert (checkout / "feature.txt").read_text() == "the feature\n"  # merged locally
    [(status, data)] = milestones(checkout, "repo_setup")
    assert status == "completed" and '"forge": "local"' in data
    # an OWNER names a GitHub account: refused before anything is made
    owned = phasegate_cli(
        "run", "--new-project", "octo/other", "-C", str(tmp_path / "template"), TICKET,
        cwd=tmp_path,
    )  # fmt: skip
    assert owned.returncode == 2 and "forge.kind" in owned.stderr
    assert not (tmp_path / "other").exists()


def test_a_name_taken_after_the_check_fails_the_workflow_before_any_issue(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    project = projects.resolve("gadgets", tmp_path / "gadgets", template(github, tmp_path))
    root = projects.make_checkout(project)
    github.server.create_repo("phasegate-bot", "gadgets", description="theirs")  # a race
    engine, _ = engine_for(root)
    row = engine.advance(engine.start("t", TICKET, state={"new_project": project.state()}))
    assert row["status"] == "failed" and "is not this workflow's" in (row["error"] or "")
    assert repo_posts(github) == []
    assert github.server.counts("phasegate-bot/gadgets")["issues"] == 0


def test_an_organisations_repository_is_made_through_the_orgs_endpoint(
    github: GitHubLab, tmp_path: Path
) -> None:
    github.server.add_user("octo-org", type="Organization")
    settings = ForgeSettings(kind="github", repository="octo-org/gizmo", base_url=github.api_url)
    auth = ForgeAuth.from_token(github.bot.token, "GITHUB_TOKEN")
    forge = GitHubForge("octo-org/gizmo", auth, tmp_path, Workspace(), settings)
    assert forge.find_repository() is None
    made = forge.create_repository("d", private=False)
    assert made["full_name"] == "octo-org/gizmo" and not made["private"]
    posted = [(r.path, r.status) for r in github.server.requests if r.method == "POST"]
    assert posted == [("/orgs/octo-org/repos", 201)]
    assert github.server.permission("octo-org/gizmo", "phasegate-bot") == "admin"
    assert (forge.find_repository() or {}).get("description") == "d"


def test_a_github_app_makes_its_organisations_repository_and_pushes_to_it(
    github: GitHubLab, tmp_path: Path
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    github.server.add_user("octo-org", type="Organization")
    github.server.add_app(78, public.decode(), 7002, slug="phasegate", owner="octo-org")
    checkout = make_repo(tmp_path / "gizmo")
    (checkout / "app.pem").write_text(pem)
    settings = ForgeSettings(
        kind="github",
        repository="octo-org/gizmo",
        base_url=github.api_url,
        app_id=78,
        installation_id=7002,
        private_key_file="app.pem",
    )
    auth = forge_auth(settings, checkout, "octo-org/gizmo", environ={})
    forge = GitHubForge("octo-org/gizmo", auth, checkout, Workspace(), settings)
    made = forge.create_repository("d", private=True)
    forge.publish_branch("main")
    assert made["full_name"] == "octo-org/gizmo"
    posted = [(r.path, r.login) for r in github.server.requests if r.path.endswith("/repos")]
    assert posted == [("/orgs/octo-org/repos", "phasegate[bot]")]  # never GET /user
    head = github.server.repo("octo-org/gizmo").git.git("rev-parse", "main").strip()
    assert head == git(checkout, "rev-parse", "main")
