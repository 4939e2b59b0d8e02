"""Agents: the Runner protocol and the runners phasegate ships."""

from __future__ import annotations

from pathlib import Path

from phasegate.agents.base import ERROR_KINDS, AgentRequest, AgentResult, Runner
from phasegate.agents.command import CommandRunner
from phasegate.agents.scripted import ScriptedRunner
from phasegate.cartridge import RoleBinding

__all__ = [
    "ERROR_KINDS",
    "AgentRequest",
    "AgentResult",
    "CommandRunner",
    "Runner",
    "ScriptedRunner",
    "make_runner",
]


def make_runner(binding: RoleBinding, repo: Path) -> Runner:
    """The runner a role binding names; relative script paths resolve against ``repo``."""
    if binding.runner == "command":
        return CommandRunner(binding)
    assert binding.script is not None
    script = Path(binding.script)
    return ScriptedRunner.from_file(script if script.is_absolute() else repo / script)
