"""Agents: the Runner protocol and the runners phasegate ships."""

from __future__ import annotations

from pathlib import Path

from phasegate.agents.base import ERROR_KINDS, AgentRequest, AgentResult, Runner
from phasegate.agents.claude_code import ClaudeCodeRunner
from phasegate.agents.codex import CodexRunner
from phasegate.agents.command import CommandRunner
from phasegate.agents.mini_swe_agent import MiniSweAgentRunner
from phasegate.agents.scripted import ScriptedRunner
from phasegate.cartridge import RoleBinding

__all__ = [
    "ERROR_KINDS",
    "AgentRequest",
    "AgentResult",
    "ClaudeCodeRunner",
    "CodexRunner",
    "CommandRunner",
    "MiniSweAgentRunner",
    "Runner",
    "ScriptedRunner",
    "make_runner",
]


def make_runner(binding: RoleBinding, repo: Path) -> Runner:
    """The runner a role binding names; relative script paths resolve against ``repo``."""
    if binding.runner == "command":
        return CommandRunner(binding)
    if binding.runner == "claude-code":
        return ClaudeCodeRunner(binding)
    if binding.runner == "codex":
        return CodexRunner(binding)
    if binding.runner == "api":
        from phasegate.agents.api import ApiRunner  # litellm is heavy: import it when bound

        return ApiRunner(binding)
    if binding.runner == "mini-swe-agent":
        return MiniSweAgentRunner(binding)
    assert binding.script is not None
    script = Path(binding.script)
    return ScriptedRunner.from_file(script if script.is_absolute() else repo / script)
