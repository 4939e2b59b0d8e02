"""The cartridge ``phasegate init`` writes, chosen from what this machine and repository offer.

``default_cartridge`` looks for the agent CLIs on PATH, the model keys in the
environment, the base branch and the test commands (``phasegate.tools.discover``)
and returns the text with what it chose and what a person still has to do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phasegate.config.agents import AGENT_PROGRAMS
from phasegate.config.cartridge import CARTRIDGE_FILE, ROLE_SESSION_LINES
from phasegate.tools.discover import (
    CheckGuess,
    Which,
    detect_base_branch,
    detect_checks,
    keys_set,
)
from phasegate.tools.sample_agent import SAMPLE_AGENT_NAME, SAMPLE_COMMAND

__all__ = [
    "BIND_A_REAL_AGENT",
    "DEFAULT_API_MODELS",
    "DefaultCartridge",
    "default_cartridge",
    "next_steps",
]


@dataclass(frozen=True)
class DefaultCartridge:
    """What ``phasegate init`` chose, and the cartridge text it writes.

    ``runner`` is the runner every role is bound to: ``command`` with
    ``sample_agent`` true when no agent was found (every role runs the stand-in
    ``phasegate.tools.sample_agent``, ``command`` running it; no file is written
    for it). ``notes`` say what a person still has to do.
    """

    text: str
    runner: str | None
    executable: str | None
    api_key_env: str | None
    model: str | None
    base_branch: str
    base_branch_why: str
    checks: tuple[CheckGuess, ...]
    notes: tuple[str, ...]
    sample_agent: bool = False
    command: str | None = None


#: The model an ``api`` binding gets by default, by the key that is set (litellm names).
DEFAULT_API_MODELS = {
    "ANTHROPIC_API_KEY": "anthropic/claude-sonnet-4-5",
    "OPENAI_API_KEY": "openai/gpt-5",
}


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"  # JSON strings are TOML


def _role_tables(runner: str, lines: Sequence[str]) -> str:
    return "\n".join(
        f'[roles.{name}]\nrunner = "{runner}"\n' + "".join(f"{line}\n" for line in lines)
        for name in ROLE_SESSION_LINES
    )


def _litellm_installed() -> bool:
    return importlib.util.find_spec("litellm") is not None


def default_cartridge(
    repo: Path, *, which: Which = shutil.which, environ: Mapping[str, str] | None = None
) -> DefaultCartridge:
    """Choose the cartridge ``phasegate init`` writes from what this machine and repo offer.

    Roles: the first of ``AGENT_PROGRAMS`` on PATH that needs no model named
    (``claude``, else ``codex``, else ``gemini``), else ``api`` when
    ANTHROPIC_API_KEY or OPENAI_API_KEY is set, else the ``command`` runner running
    the sample agent (``phasegate.tools.sample_agent``); every
    other agent CLI found is named in a note. ``api_key_env`` is written only when that
    variable is set. The base branch and the checks come from the repository
    (``discover.detect_base_branch``, ``discover.detect_checks``).
    """
    env = os.environ if environ is None else environ
    keys = keys_set(("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"), env)
    notes: list[str] = []
    runner = executable = key = model = command = None
    sample = False
    found = {name: which(program.executable) for name, program in AGENT_PROGRAMS.items()}
    # The first program found that needs no model named binds every role; the others
    # found are named, for a person to bind with the model they want.
    chosen = next((n for n, p in AGENT_PROGRAMS.items() if found[n] and not p.needs_model), None)
    others = [n for n in AGENT_PROGRAMS if found[n] and n != chosen]
    if others:
        notes.append(
            "also found: "
            + ", ".join(f"{AGENT_PROGRAMS[n].executable} ({found[n]})" for n in others)
            + "; bind a role to one with its runner"
            + (" and a model" if any(AGENT_PROGRAMS[n].needs_model for n in others) else "")
            + " (docs/runners.md)"
        )
    if chosen is not None:
        program = AGENT_PROGRAMS[chosen]
        runner, executable, cli = chosen, found[chosen], program.executable
        wanted = program.key_env or "ANTHROPIC_API_KEY"
        if keys.get(wanted):
            key = wanted
            lines = [f'api_key_env = "{wanted}"   # the variable holding the model key']
        else:
            lines = [f'# api_key_env = "{wanted}"   # the variable holding the model key']
            notes.append(
                f"{wanted} is not set: the {runner} roles get no model key (agents run "
                f"with a HOME of their own, so a login in yours does not reach them); "
                f'set it and uncomment api_key_env = "{wanted}" in each role'
            )
        header = (
            f"# {cli} was found at {executable}: every role runs it. Read-only roles "
            "(plan, plan_review,\n# review, verification) may only read; the build "
            "role may edit files and run commands.\n"
        )
        roles = header + _role_tables(runner, lines)
    elif keys["ANTHROPIC_API_KEY"] or keys["OPENAI_API_KEY"]:
        key = "ANTHROPIC_API_KEY" if keys["ANTHROPIC_API_KEY"] else "OPENAI_API_KEY"
        runner, model = "api", DEFAULT_API_MODELS[key]
        roles = (
            "# No agent CLI was found on PATH, but a model key is set: every role calls the\n"
            "# model through litellm; the build role answers with a diff phasegate applies.\n"
            + _role_tables(runner, [f'model = "{model}"', f'api_key_env = "{key}"'])
        )
        if not _litellm_installed():
            notes.append("the api runner needs litellm: pip install 'phasegate[api]'")
    else:
        # Nothing to call a model with: every role runs the sample agent, so a first
        # run shows a whole workflow on this repository before a model is paid for.
        runner, sample, command = "command", True, SAMPLE_COMMAND
        roles = _sample_roles(command)
        notes.append(BIND_A_REAL_AGENT)
    base, base_why = detect_base_branch(repo)
    checks = tuple(detect_checks(repo))
    if checks:
        checks_line = f"checks = {_toml_list([c.command for c in checks])}"
    else:
        checks_line = 'checks = []                 # commands that must pass, e.g. ["make test"]'
        notes.append("no test command was found: list yours in landing_areas.checks")
    text = f"""# phasegate cartridge: how this repository's tickets are worked.
# Every key is checked; an unknown or malformed key stops phasegate with its name.

[workflow]
base_branch = "{base}"
profile = "review"          # manual, review, trusted, auto, ci, full-auto: how far it goes alone
# auto_merge = true         # given, it wins over the profile's (review: approve-merge first)
content_language = "en"     # "en" or "zh", for reports and comments
acceptance_verification = true

[limits]
max_plan_rounds = 3
max_pr_review_rounds = 3
# require_full_review_rounds = true   # every round runs, an approved change reviewed again
max_dev_retries = 2
agent_retries = 2

[landing_areas]
worktree_root = ".phasegate/worktrees"
{checks_line}
check_timeout = 600

[forge]
kind = "local"

# The development graph (docs/proposals.md, graph mode): competing plans,
# a read-only build answering with a diff, review tiers, a bounded fix loop, and a
# gate on the draft PR proposal before anything lands.
# [graph]
# enabled = true
# fix_attempts = 2

# Roles: plan, plan_review, build, review, verification.
{roles}"""
    return DefaultCartridge(
        text=text,
        runner=runner,
        executable=executable,
        api_key_env=key,
        model=model,
        base_branch=base,
        base_branch_why=base_why,
        checks=checks,
        notes=tuple(notes),
        sample_agent=sample,
        command=command,
    )


#: init's advice, when it bound the sample agent, on binding a real one later.
BIND_A_REAL_AGENT = (
    f"to bind a real agent later, edit [agents.{SAMPLE_AGENT_NAME}] (or a [roles.NAME] table) "
    f'in {CARTRIDGE_FILE}: e.g. runner = "claude-code" in place of its command '
    "(docs/runners.md), then commit it; `phasegate init --force` starts over, "
    "dropping your changes to the cartridge"
)


def _sample_roles(command: str) -> str:
    """Every role bound to the sample agent, one ``[agents.sample]`` profile running it."""
    return (
        "# No agent CLI (claude, codex, gemini) was found on PATH and no model key is set:\n"
        "# every role runs phasegate's sample agent, a stand-in that answers by rule\n"
        "# (a one-line plan, a line added to NOTES.md, approvals, a confirmed verification).\n"
        "# It calls no model and spends nothing. It is installed with phasegate: the command\n"
        "# runner sets PHASEGATE_PYTHON to the Python running phasegate, so every clone and\n"
        "# machine runs it alike. To bind a real agent, change [agents.sample], e.g.\n"
        '#   runner = "claude-code"   (in place of command and timeout)\n'
        "# or bind a role of its own in a [roles.NAME] table (docs/runners.md); then commit.\n"
        f"[agents.{SAMPLE_AGENT_NAME}]\n"
        'runner = "command"\n'
        # Single quotes: a TOML literal string keeps the double quotes the shell needs.
        f"command = '{command}'\n"
        "timeout = 60                # seconds; the agent is stopped after it\n\n"
        "[roles]\n" + "".join(f'{name} = "{SAMPLE_AGENT_NAME}"\n' for name in ROLE_SESSION_LINES)
    )


def next_steps(chosen: DefaultCartridge) -> list[str]:
    """What a person does after ``phasegate init`` chose ``chosen``: command lines, each
    with what it does after a ``#``."""
    commit = (
        f'git add {CARTRIDGE_FILE} && git commit -m "phasegate cartridge"   # workflows '
        "run under the committed cartridge"
    )
    if chosen.sample_agent:
        return [
            commit,
            'phasegate run "Add a line to NOTES.md"   # plans, builds, reviews, reports; '
            "stops at wait (profile review), exit 0",
            "phasegate approve-merge ID   # merges, verifies: completed",
        ]
    return [
        "phasegate doctor   # is everything a run needs there?",
        commit,
        'phasegate dry-run "a small ticket"   # offline, a scripted model, a throwaway clone',
        'phasegate run "your ticket"',
    ]
