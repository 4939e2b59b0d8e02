"""A new project: the repository made before the issue, in preparation
(docs/contracts/lifecycle.md: preparation).

``phasegate run --new-project [OWNER/]NAME "ticket"`` goes in three steps::

    project = resolve(name, directory, template)   # what would be made; refuses a taken name
    root = make_checkout(project)                  # the local repository: cartridge, first commit
    set_up(ctx, deps)                              # in preparation: the forge's repository

- ``resolve`` reads the cartridge to copy (``template``'s ``phasegate.toml``, else
  the one ``phasegate init`` would write) and, on GitHub, names the repository
  ``OWNER/NAME`` (OWNER: the token's user when not given). A repository of that
  name that no earlier try of this project made is refused there, before
  anything is made (``NewProjectRefused``).
- ``make_checkout`` makes ``directory``: ``git init`` on the base branch, the
  cartridge (its ``forge.repository`` set to ``OWNER/NAME``) and a README in one
  first commit. A directory holding this project's earlier try is taken as it is.
- ``set_up`` runs at the top of preparation when the workflow's
  ``state["new_project"]`` says so: the ``repo_setup`` milestone is written
  ``in_progress`` before GitHub is asked to create the repository (empty, its
  description naming the workflow) and settled once the first commit is pushed
  as the base branch. After a crash the repository is found again by
  ``GET /repos/{owner}/{repo}`` and taken as this workflow's only when its
  description names the workflow: a kill never makes two repositories, never
  fails on "name already exists" from its own earlier try, and never adopts
  someone else's. On the local forge ``repo_setup`` records the local
  repository: a new project offline is that repository.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phasegate.config.cartridge import CARTRIDGE_FILE, Cartridge, load_cartridge
from phasegate.git.command import git
from phasegate.phases.repo_setup import KIND, NewProjectRefused, description_for, set_up
from phasegate.tools.init import default_cartridge

if TYPE_CHECKING:
    from phasegate.forge.github.forge import GitHubForge
    from phasegate.store import Store

__all__ = [
    "KIND",
    "NewProject",
    "NewProjectRefused",
    "description_for",
    "earlier_workflow",
    "make_checkout",
    "resolve",
    "set_up",
]

# GitHub's rules: an owner is a login, a name 1-100 of these (not "." or "..").
_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_FORGE_TABLE = re.compile(r"^\[forge\][ \t]*(?:#.*)?$", re.MULTILINE)
_TABLE = re.compile(r"^\s*\[", re.MULTILINE)
_REPOSITORY_KEY = re.compile(r"^[ \t]*repository[ \t]*=.*$", re.MULTILINE)


@dataclass(frozen=True)
class NewProject:
    """What ``--new-project`` makes: the checkout at ``directory`` holding
    ``cartridge_text``; on GitHub the repository ``repository`` (owner/name;
    None on the local forge), ``private`` or not. ``earlier``: the workflow of an
    earlier try found in ``directory`` (it is continued, not filed again).
    """

    name: str
    directory: Path
    cartridge_text: str
    base_branch: str
    repository: str | None
    private: bool
    earlier: str | None = None

    def cartridge(self) -> Cartridge:
        """The cartridge the checkout gets, validated."""
        return _cartridge_of(self.cartridge_text, self.directory)

    def state(self) -> dict[str, Any]:
        """The workflow's ``state["new_project"]``, which preparation's ``set_up`` reads."""
        return {"name": self.name, "repository": self.repository, "private": self.private}


def _split(name: str) -> tuple[str | None, str]:
    owner, _, bare = name.strip().rpartition("/")
    if (owner and not _OWNER.match(owner)) or not _NAME.match(bare) or bare in (".", ".."):
        raise NewProjectRefused(
            f"--new-project {name!r}: give NAME or OWNER/NAME (letters, digits, '.', '-', '_')"
        )
    return owner or None, bare


def _template(template: Path, directory: Path) -> str:
    """The cartridge text to copy: ``template``'s, else the one init would write."""
    path = template / CARTRIDGE_FILE
    if path.is_file():
        load_cartridge(template)  # a bad template is named before anything is made
        return path.read_text()
    return default_cartridge(directory).text


def _cartridge_of(text: str, where: Path) -> Cartridge:
    try:
        return Cartridge.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise NewProjectRefused(f"{where / CARTRIDGE_FILE}: {exc}") from None


def _with_repository(text: str, repository: str) -> str:
    """``text`` with ``forge.repository = "<repository>"`` in its ``[forge]`` table."""
    header = _FORGE_TABLE.search(text)
    if header is None:
        return text
    start = header.end()
    following = _TABLE.search(text, start)
    end = following.start() if following else len(text)
    line = f'repository = "{repository}"'
    body = text[start:end]
    if _REPOSITORY_KEY.search(body):
        body = _REPOSITORY_KEY.sub(line, body, count=1)
    else:
        body = f"\n{line}" + body
    return text[:start] + body + text[end:]


def earlier_workflow(store: Store, name: str) -> str | None:
    """The workflow of an earlier try at new project ``name`` in this store, if any."""
    for row in store.list_workflows():
        said = (row.get("state") or {}).get("new_project") or {}
        if said.get("name") == name and row["status"] != "cancelled":
            return str(row["id"])
    return None


def resolve(
    name: str,
    directory: Path,
    template: Path,
    *,
    private: bool = True,
    earlier: str | None = None,
    environ: dict[str, str] | None = None,
) -> NewProject:
    """What ``--new-project name`` makes at ``directory`` from ``template``'s cartridge.

    ``earlier``: the workflow of an earlier try found in ``directory`` (its own
    repository is not refused). Raises NewProjectRefused (a bad name, a non-empty
    directory that is no earlier try, a GitHub repository of that name that is
    not this project's), CartridgeError, ForgeError / ForgeAuthError."""
    owner, bare = _split(name)
    directory = directory.resolve()
    if earlier is None and directory.exists() and any(directory.iterdir()):
        raise NewProjectRefused(
            f"{directory} exists and is not empty: give --dir a new directory for {bare}"
        )
    text = _template(template, directory)
    cartridge = _cartridge_of(text, template)
    base = cartridge.workflow.base_branch or "main"
    if cartridge.forge.kind == "local":
        if owner is not None:
            raise NewProjectRefused(
                f"--new-project {name!r}: an OWNER names a GitHub account, and "
                f'{CARTRIDGE_FILE} has forge.kind = "local" (set kind = "github")'
            )
        return NewProject(bare, directory, text, base, None, private, earlier)
    if cartridge.forge.kind != "github":
        # Only GitHub's repositories are made here; another forge's project is made
        # by a person (its group, visibility and protection are theirs to choose).
        raise NewProjectRefused(
            f"--new-project {name!r}: on {cartridge.forge.kind} make the project yourself, "
            "clone it, and run phasegate in the clone (nothing was made)"
        )
    if owner is None and cartridge.forge.uses_app:
        raise NewProjectRefused(
            f"--new-project {name!r}: a GitHub App creates repositories in an organisation "
            "only: give OWNER/NAME (and forge.installation_id)"
        )
    if owner is None:
        owner = _github(cartridge, directory, f"{bare}/{bare}", environ).login()
    repository = f"{owner}/{bare}"
    if earlier is None and _github(cartridge, directory, repository, environ).find_repository():
        raise NewProjectRefused(
            f"{repository} already exists on GitHub and is not this project's: "
            "choose another NAME (nothing was made)"
        )
    text = _with_repository(text, repository)
    if _cartridge_of(text, template).forge.repository != repository:
        raise NewProjectRefused(
            f"{template / CARTRIDGE_FILE}: forge.repository could not be set to {repository}; "
            "write the [forge] table as a table of its own"
        )
    return NewProject(bare, directory, text, base, repository, private, earlier)


def _github(
    cartridge: Cartridge, directory: Path, repository: str, environ: dict[str, str] | None
) -> GitHubForge:
    from phasegate.forge.github.auth import forge_auth
    from phasegate.forge.github.forge import GitHubForge
    from phasegate.git.workspace import Workspace

    auth = forge_auth(cartridge.forge, directory, repository, environ)
    return GitHubForge(repository, auth, directory, Workspace(), cartridge.forge)


def make_checkout(project: NewProject) -> Path:
    """Make the project's local repository (an earlier try's is kept as it is):
    ``git init`` on the base branch, the cartridge and a README, one first commit.
    Returns its path.
    Raises GitError, OSError."""
    root = project.directory
    if (root / ".git").exists() and git(["rev-parse", "-q", "--verify", "HEAD"], root, check=False):
        return root
    root.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "-b", project.base_branch], root)
    (root / CARTRIDGE_FILE).write_text(project.cartridge_text)
    readme = root / "README.md"
    if not readme.exists():
        readme.write_text(f"# {project.name}\n")
    git(["add", CARTRIDGE_FILE, "README.md"], root)
    git(["commit", "-q", "-m", f"{project.name}: first commit (phasegate new project)"], root)
    return root
