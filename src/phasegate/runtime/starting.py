"""What a new workflow is filed with: the checks that must pass before an issue and a
branch exist, its base branch, its ``auto_merge`` and its first state.

``Engine.start`` files the workflow with these (``Store.create_workflow``); they
are apart from the engine because they only read the cartridge and the clone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phasegate.agents import binding_problems
from phasegate.agents.service import AgentService
from phasegate.config.cartridge import CARTRIDGE_FILE, Cartridge, CartridgeError
from phasegate.core.contract import PhasegateError
from phasegate.core.state import WorkflowState
from phasegate.git import files as gitfs
from phasegate.git.workspace import Workspace, git

__all__ = ["Filing", "filing"]


@dataclass(frozen=True)
class Filing:
    """A new workflow's base branch, whether it merges on its own, and its first state."""

    base_branch: str
    auto_merge: bool
    state: WorkflowState


def filing(
    cartridge: Cartridge,
    repo: Path,
    workspace: Workspace,
    agents: AgentService,
    *,
    profile: str | None,
    auto_merge: bool | None,
    state: WorkflowState | None,
) -> Filing:
    """Check what would otherwise fail only after an issue and a branch exist (the
    profile, the base branch, every role's runner) and return the new workflow's
    Filing; ``state`` is added to its first state (``Engine.start`` says how
    ``profile`` and ``auto_merge`` choose). Raises CartridgeError naming the key,
    or PhasegateError."""
    if profile is not None and not profile.strip():
        raise CartridgeError("--profile: the profile name is empty")
    chosen = cartridge.profile(profile)
    head = gitfs.resolve(repo, "HEAD")  # from git's files; None: ask git
    if not (head or git(["rev-parse", "--verify", "-q", "HEAD"], repo, check=False)):
        raise PhasegateError(f"{repo} has no commits yet; commit something first")
    base = cartridge.workflow.base_branch or git(["symbolic-ref", "--short", "HEAD"], repo)
    if not workspace.branch_exists(repo, base):
        raise CartridgeError(
            f"{CARTRIDGE_FILE}: workflow.base_branch: {base!r} is not a branch of {repo}"
        )
    problems = []
    cartridge.require_roles()
    for role in cartridge.workflow_roles():
        binding = getattr(cartridge.roles, role)
        if binding is not None:
            problems += binding_problems(role, binding)
            agents.runner(role)  # a scripted file that does not load raises here
    if problems:
        raise CartridgeError(f"{CARTRIDGE_FILE}: " + "; ".join(problems))
    # A person's choice for this run beats the file; a profile named here, its default.
    merges = (
        auto_merge
        if auto_merge is not None
        else chosen.auto_merge
        if profile is not None
        else cartridge.auto_merge_for(chosen)
    )
    first: WorkflowState = {
        **(state or {}),
        "profile": chosen.as_state(),
        # kept per workflow: flipping [graph] enabled never strands one midway
        "graph_mode": cartridge.graph.enabled,
        "cartridge_sha": cartridge.source_sha,  # the committed file it runs under
    }
    return Filing(base, merges, first)
