"""``phasegate doctor``: what a run needs, what is there and what is missing.

``diagnose`` looks and never changes anything: the agent CLIs on PATH and
their versions, which model keys are set (never a value, nor any part of one),
git, the cartridge's validity and every role's binding. ``Diagnosis.missing``
lists what stops a run (an unbound role, a missing executable, an unset
``api_key_env``, litellm missing for an ``api`` role, ...); ``warnings`` what
may surprise one without stopping it (roles bound to init's sample agent). It
says which sandbox each role that starts a process gets, and the checks
(``phasegate.proc.sandbox.choose``): an explicit ``sandbox = "bwrap"`` that
cannot work here is missing, a process that will run unconfined a warning.

With ``forge.kind = "github"`` it makes one read-only call, ``GET /repos/{owner}/{repo}``
with the cartridge's credentials (``offline=True`` skips it): a refused token, a
repository the token cannot see, or one it may read but not push to is missing; GitHub
out of reach is a warning. With ``forge.kind = "gitlab"`` the one call is ``GET
/projects/:id`` (``phasegate.forge.gitlab.doctor``): a role below Developer is
missing. A Gitea forge is asked the same (``forge.gitea.access``).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from phasegate import __version__
from phasegate.agents import DEFAULT_EXECUTABLES
from phasegate.agents.base import json_object
from phasegate.agents.env import check_env
from phasegate.config.agents import AGENT_PROGRAMS, resolve_agents
from phasegate.config.cartridge import (
    CARTRIDGE_FILE,
    GRAPH_MODE_ROLES,
    GRAPH_OPTIONAL_ROLES,
    READ_ONLY_ROLES,
    ROLE_SESSION_LINES,
    Cartridge,
    CartridgeError,
    RoleBinding,
    blob_sha,
    cartridge_from_document,
)
from phasegate.config.queue import RUNNER_PROVIDERS, provider_of
from phasegate.config.toml import TomlError, read_toml
from phasegate.git.checks import check_problem
from phasegate.git.committed import committed_blob, committed_note
from phasegate.git.merge import scratch_note
from phasegate.git.workspace import GitError, Workspace, git
from phasegate.proc.sandbox import PROCESS_RUNNERS, SANDBOX_VAR, SandboxKind, bwrap_works, choose
from phasegate.store import store_server_problem
from phasegate.tools.discover import (
    AGENT_CLIS,
    MODEL_KEY_VARS,
    Which,
    git_version,
    keys_set,
    program_version,
)
from phasegate.tools.sample_agent import stand_in_notes

__all__ = ["AgentCli", "Diagnosis", "RoleStatus", "diagnose", "not_a_repository"]

#: How to get each CLI, for the message that says it is missing.
_INSTALL = {runner: program.install for runner, program in AGENT_PROGRAMS.items()}
_LITELLM_HINT = "pip install 'phasegate[api]'"


def not_a_repository(path: Path, exc: Exception) -> str:
    """Why ``git rev-parse`` in ``path`` failed, for a person: git's own reason
    when git refuses a repository that is there (``safe.directory``'s "dubious
    ownership", a broken ``.git``), else "not inside a git repository"."""
    said = str(exc).split(": ", 1)[-1].strip() if isinstance(exc, GitError) else ""
    if not said or "not a git repository" in said:
        return f"{path} is not inside a git repository"
    return f"git refuses {path}: {said}"


@dataclass
class AgentCli:
    """An agent CLI looked up on PATH: ``path`` None when not found."""

    name: str
    path: str | None
    version: str | None = None
    error: str | None = None


@dataclass
class RoleStatus:
    """One role's binding as doctor sees it. ``executable`` is the program the
    runner starts (as named); ``resolved`` where it was found, None if nowhere."""

    role: str
    bound: bool
    runner: str | None = None
    model: str | None = None
    executable: str | None = None
    resolved: str | None = None
    api_key_env: str | None = None
    api_key_set: bool | None = None
    error: str | None = None
    sandbox: str | None = None  # "bwrap" or "none"; None: its runner starts no process
    sandbox_reason: str | None = None
    agent: str | None = None  # the agent profile the binding came from
    #: Its MCP servers: name → the command as found on PATH, the url, or None (not found).
    mcp_servers: dict[str, str | None] = field(default_factory=dict)


@dataclass
class Diagnosis:
    """Everything ``phasegate doctor`` reports; ``ok`` when nothing is missing."""

    phasegate: str
    repo: str | None
    git: str | None
    agent_clis: list[AgentCli]
    keys: dict[str, bool]
    cartridge: dict[str, Any]
    roles: list[RoleStatus]
    litellm: bool
    #: The checks' sandbox: {"kind", "reason"}; empty when there are no checks.
    checks_sandbox: dict[str, str] = field(default_factory=dict)
    #: The forge: {"kind", and for GitHub "repository", "api", "credentials", and
    #: "access" (what GitHub says the credentials may do: "push", "read", or
    #: "unknown" offline or unreached)}; empty without a valid cartridge.
    forge: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


def _litellm_installed() -> bool:
    return importlib.util.find_spec("litellm") is not None


def _read_roles(raw: dict[str, Any] | None) -> dict[str, RoleBinding | str | None]:
    """Each role's binding, or the error of its own table: a cartridge that does not
    load still shows which roles are fine. Empty when the file is not TOML (``raw``
    None).

    The roles are those a valid cartridge's ``workflow_roles()`` would give: with
    ``[graph] enabled = true`` GRAPH_MODE_ROLES and the optional graph roles that
    have a table (plan_review is not asked in graph mode), else ROLE_SESSION_LINES."""
    if raw is None:
        return {}
    tables = json_object(raw.get("roles"))
    graph = json_object(raw.get("graph"))
    names: tuple[str, ...] = tuple(ROLE_SESSION_LINES)
    if graph.get("enabled") is True:
        bound = [name for name in GRAPH_OPTIONAL_ROLES if tables.get(name) is not None]
        names = (*GRAPH_MODE_ROLES, *bound)
    agents = json_object(raw.get("agents"))
    roles: dict[str, RoleBinding | str | None] = {}
    for name in names:
        table = tables.get(name)
        if table is None:
            roles[name] = None
            continue
        try:  # a role naming an agent profile is that profile's binding, as loading makes it
            table = resolve_agents({"agents": agents, "roles": {name: table}})["roles"][name]
        except ValueError as exc:
            roles[name] = str(exc)
            continue
        try:
            roles[name] = RoleBinding.model_validate(table)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(p) for p in ("roles", name, *first["loc"]))
            msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
            roles[name] = f"{key}: {msg.removeprefix('Value error, ')}"
    return roles


def _has_key(binding: RoleBinding, environ: Mapping[str, str]) -> bool:
    """Whether an agent of ``binding`` gets some model credential at all."""
    if binding.api_key_env:
        return True
    names = [*binding.env, *binding.pass_env]
    return any(n.endswith(("_API_KEY", "_AUTH_TOKEN", "_OAUTH_TOKEN")) for n in names)


def _wants_key(runner: str) -> bool:
    """Whether a ``runner``'s program reads a model key of a known variable."""
    program = AGENT_PROGRAMS.get(runner)
    return runner == "api" or (program is not None and program.key_env is not None)


def _copilot_token(binding: RoleBinding) -> bool:
    """Whether a copilot agent of ``binding`` gets a GitHub token to sign in with."""
    names = {*binding.env, *binding.pass_env}
    return bool(names & {"COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"})


#: Words a command's shell runs itself: a command starting with one names no program.
_SHELL_WORDS = frozenset(
    {
        *("!", "[[", "case", "for", "function", "if", "select", "until", "while"),
        *(".", ":", "alias", "cd", "eval", "export", "read", "set", "source", "ulimit"),
        *("umask", "unset", "echo", "printf", "test", "[", "true", "false", "pwd", "kill"),
    }
)


def _found(program: str, repo: Path, which: Which) -> str | None:
    """Where ``program`` is: a relative path is the checkout's (a command runs in
    its worktree), an absolute one must be executable, a bare name on PATH, and
    ``$PHASEGATE_PYTHON`` phasegate's own Python."""
    if "/" not in program:  # $PHASEGATE_PYTHON: the Python the command runner names
        return sys.executable if program == "$PHASEGATE_PYTHON" else which(program)
    path = Path(program) if Path(program).is_absolute() else repo / program
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _command_program(command: str) -> str | None:
    """The program a ``command`` role's shell command starts first: its first word after
    any ``NAME=value`` assignments and ``exec``/``command``; None when the shell runs
    that word itself (``for``, ``cd``, ``export``: doctor cannot tell what follows) or
    the command does not split."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    # Assignments, and `exec`/`command`, come before the program they run.
    while words and (
        words[0] in ("exec", "command") or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], re.S)
    ):
        words = words[1:]
    if not words or words[0].rstrip(";") in _SHELL_WORDS or words[0][:1] in ("(", "{", "-"):
        return None
    return words[0]


def _role_status(
    name: str,
    binding: RoleBinding | str | None,
    repo: Path,
    which: Which,
    environ: Mapping[str, str],
    litellm: bool,
    missing: list[str],
    warnings: list[str],
) -> RoleStatus:
    where = f"roles.{name}"
    if binding is None:
        missing.append(f"{where} is not bound: add a [{where}] table to {CARTRIDGE_FILE}")
        return RoleStatus(name, bound=False)
    if isinstance(binding, str):
        if not any(binding in problem for problem in missing):  # the cartridge's error says it
            missing.append(binding)
        return RoleStatus(name, bound=True, error=binding)
    status = RoleStatus(
        name,
        bound=True,
        runner=binding.runner,
        model=binding.model,
        api_key_env=binding.api_key_env,
        agent=binding.agent,
    )
    _mcp_servers(where, name, binding, status, which, missing, warnings)
    # Any runner that starts a program names it in `executable`, or has a default one.
    executable = getattr(binding, "executable", None) or DEFAULT_EXECUTABLES.get(binding.runner)
    if binding.runner == "command" and binding.command:
        program = _command_program(binding.command)
        if program:
            status.executable, status.resolved = program, _found(program, repo, which)
            if status.resolved is None:
                # The shell's own words are not looked for: this one would exit 127.
                missing.append(
                    f"{where}: `{program}` (the first word of its command) is not found"
                    + (" in the repository" if "/" in program else " on PATH")
                )
    elif executable:
        status.executable, status.resolved = executable, which(executable)
        if status.resolved is None:
            hint = _INSTALL.get(binding.runner)
            missing.append(
                f"{where}: the {binding.runner} executable `{executable}` is not found"
                + (f" (install it: {hint}, or set executable)" if hint else "")
            )
    if binding.runner == "scripted" and binding.script:
        script = Path(binding.script)
        if not (script if script.is_absolute() else repo / script).is_file():
            missing.append(f"{where}: the script {binding.script} does not exist")
    if binding.api_key_env:
        status.api_key_set = bool(environ.get(binding.api_key_env))
        if not status.api_key_set:
            missing.append(
                f"{where}: api_key_env {binding.api_key_env} is not set in the environment"
            )
    elif _wants_key(binding.runner) and not _has_key(binding, environ):
        warnings.append(
            f"{where}: no api_key_env; the {binding.runner} agent gets no model key "
            "unless its env or base_url provides one"
        )
    if binding.runner == "copilot" and not binding.base_url and not _copilot_token(binding):
        # Without a provider of its own Copilot signs in to GitHub, and its home is
        # the workflow's own: no person's stored login is there.
        warnings.append(
            f"{where}: no base_url and no GitHub token passed (pass_env COPILOT_GITHUB_TOKEN, "
            "GH_TOKEN or GITHUB_TOKEN): the copilot agent cannot sign in"
        )
    if binding.runner == "api" and not litellm:
        missing.append(f"{where}: the api runner needs litellm: {_LITELLM_HINT}")
    if binding.runner in PROCESS_RUNNERS:
        status.sandbox, status.sandbox_reason = _sandbox(where, binding.sandbox, missing, warnings)
    return status


def _mcp_servers(
    where: str,
    role: str,
    binding: RoleBinding,
    status: RoleStatus,
    which: Which,
    missing: list[str],
    warnings: list[str],
) -> None:
    """Each MCP server's command found (``missing`` when not), and the servers a
    program will not start named (``warnings``)."""
    for server_name, server in binding.mcp_servers.items():
        if server.url is not None:
            status.mcp_servers[server_name] = server.url
            continue
        found = which(server.command or "")
        status.mcp_servers[server_name] = found
        if found is None:
            profile = f" (agent profile {binding.agent})" if binding.agent else ""
            missing.append(
                f"{where}.mcp_servers.{server_name}.command{profile}: "
                f"`{server.command}` is not found"
            )
    program = {"gemini": "Gemini CLI", "qwen": "Qwen Code"}.get(binding.runner)
    if binding.mcp_servers and program and role in READ_ONLY_ROLES:
        warnings.append(
            f"{where}.mcp_servers: {program} starts no MCP server for a read-only role "
            f"(its workspace is not trusted); only a {binding.runner} build gets them"
        )


def _sandbox(
    where: str, setting: SandboxKind | None, missing: list[str], warnings: list[str]
) -> tuple[str, str]:
    kind, reason = choose(setting)
    if kind == "bwrap" and bwrap_works() is not None:
        missing.append(f'{where}.sandbox = "bwrap", but it is {reason}')
    elif kind == "none":
        warnings.append(f"{where} runs UNCONFINED (no sandbox): {reason}")
    return kind, reason


def diagnose(
    repo: Path,
    *,
    which: Which = shutil.which,
    environ: Mapping[str, str] | None = None,
    version_timeout_s: float = 15.0,
    offline: bool = False,
) -> Diagnosis:
    """Look at this machine and the repository at ``repo``; change nothing.

    ``offline``: send nothing to the forge (a GitHub forge is judged from the
    cartridge, the origin remote and the environment alone)."""
    env = os.environ if environ is None else environ
    missing: list[str] = []
    warnings: list[str] = []
    git_found = git_version(which)
    if git_found is None:
        missing.append("git is not on PATH")
    root: Path | None = None
    try:
        root = Path(git(["rev-parse", "--show-toplevel"], repo.resolve()))
    except (GitError, OSError) as exc:
        missing.append(not_a_repository(repo.resolve(), exc))

    litellm = _litellm_installed()
    cartridge_info: dict[str, Any] = {"path": None, "found": False, "valid": False, "error": None}
    roles: list[RoleStatus] = []
    cartridge: Cartridge | None = None
    if root is not None:
        path = root / CARTRIDGE_FILE
        cartridge_info.update(path=str(path), found=path.is_file())
        if not path.is_file():
            missing.append(f"no cartridge: run `phasegate init` in {root}")
        else:
            # Read once: the roles of a cartridge that does not load are read from it too.
            raw: dict[str, Any] | None = None
            try:
                raw = read_toml(path)
                cartridge = cartridge_from_document(root, raw, sha=blob_sha(path.read_bytes()))
                cartridge_info["valid"] = True
                note = committed_note(*committed_blob(root, cartridge), cartridge)
                if note is not None:
                    warnings.append(note)
            except (TomlError, CartridgeError) as exc:
                cartridge_info["error"] = str(exc)
                missing.append(f"the cartridge is invalid: {exc}")
            bindings: dict[str, RoleBinding | str | None]
            if cartridge is not None:
                bindings = {
                    name: getattr(cartridge.roles, name) for name in cartridge.workflow_roles()
                }
            else:
                bindings = _read_roles(raw)
            for name, binding in bindings.items():
                roles.append(
                    _role_status(name, binding, root, which, env, litellm, missing, warnings)
                )
            stand_in_notes(bindings, root, missing, warnings)  # init's sample agent
    if root is not None:  # a branch a killed merge's scratch checkout still holds
        for path, branch in Workspace().left_scratch_checkouts(root):
            warnings.append(scratch_note(path, branch))
    forge: dict[str, str] = {}
    if cartridge is not None and root is not None:
        _check_workflow(cartridge, root, env, missing, warnings)
        _check_queue(cartridge, warnings)
        forge = _forge(cartridge, root, env, missing, warnings, offline=offline)
        hook_env = cartridge.notify.webhook_env
        if hook_env and not env.get(hook_env):
            warnings.append(
                f"notify.webhook_env: {hook_env} is not set; no webhook notification is sent"
            )
    machine = env.get(SANDBOX_VAR, "")
    if machine not in ("", "bwrap", "none"):  # run refuses it: so does doctor
        missing.append(f'{SANDBOX_VAR}={machine!r}: give "bwrap" or "none"')
    checks_sandbox: dict[str, str] = {}
    if cartridge is not None and cartridge.landing_areas.checks:
        kind, reason = _sandbox("landing_areas", cartridge.landing_areas.sandbox, missing, warnings)
        checks_sandbox = {"kind": kind, "reason": reason}

    names = [*AGENT_CLIS, *(r.executable for r in roles if r.executable and r.runner != "command")]
    clis = [AgentCli(name, which(name)) for name in dict.fromkeys(names)]
    # Side by side: a node CLI's --version alone can take seconds on a loaded machine.
    present = [cli for cli in clis if cli.path]
    with ThreadPoolExecutor(max_workers=8) as pool:
        versions = list(pool.map(lambda c: program_version(c.path, version_timeout_s), present))
    for cli, (version, error) in zip(present, versions, strict=True):
        cli.version, cli.error = version, error
    key_names = [*MODEL_KEY_VARS, *(r.api_key_env for r in roles if r.api_key_env)]
    return Diagnosis(
        phasegate=__version__,
        repo=str(root) if root else None,
        git=git_found,
        agent_clis=clis,
        keys=keys_set(key_names, env),
        cartridge=cartridge_info,
        roles=roles,
        litellm=litellm,
        checks_sandbox=checks_sandbox,
        forge=forge,
        missing=missing,
        warnings=warnings,
    )


def _forge(
    cartridge: Cartridge,
    root: Path,
    env: Mapping[str, str],
    missing: list[str],
    warnings: list[str],
    *,
    offline: bool,
) -> dict[str, str]:
    """What the forge will be: the repository, the API, whose credentials (never a
    token's value) and, unless ``offline``, what GitHub says they may do there. A
    GitHub forge that could not start is a problem."""
    settings = cartridge.forge
    if settings.kind == "local":
        return {"kind": "local"}
    if settings.kind == "gitlab":
        from phasegate.forge.gitlab.doctor import looked_at

        return looked_at(settings, root, env, missing, warnings, offline=offline)
    if settings.kind == "gitea":
        from phasegate.forge.gitea.access import diagnose_gitea

        return diagnose_gitea(settings, root, env, missing, warnings, offline=offline)
    from phasegate.forge.github.doctor import looked_at as github_looked_at

    return github_looked_at(settings, root, env, missing, warnings, offline=offline)


def _check_queue(cartridge: Cartridge, warnings: list[str]) -> None:
    """Warn of a ``[queue]`` provider cap no role's calls count against: a typo, or a
    provider no role uses any more; the cap then holds nothing back."""
    used = {
        provider_of(binding)
        for name in cartridge.workflow_roles()
        if (binding := getattr(cartridge.roles, name)) is not None
    }
    known = sorted(used | set(RUNNER_PROVIDERS.values()))
    for provider in cartridge.queue.max_calls_per_provider:
        if provider != "*" and provider.lower() not in used:
            near = difflib.get_close_matches(provider.lower(), known, n=1)
            warnings.append(
                f"queue.max_calls_per_provider: no role here calls {provider!r}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + f"; the roles' providers: {', '.join(sorted(used)) or 'none'}; "
                "its cap holds nothing back"
            )


def _check_workflow(
    cartridge: Cartridge,
    root: Path,
    environ: Mapping[str, str],
    missing: list[str],
    warnings: list[str],
) -> None:
    base = cartridge.workflow.base_branch
    if base is None:
        try:
            git(["symbolic-ref", "--short", "HEAD"], root)
        except GitError:
            missing.append("workflow.base_branch is not set and HEAD is detached: set it")
    else:
        try:
            git(["rev-parse", "--verify", "-q", f"refs/heads/{base}"], root)
        except GitError:
            missing.append(f"workflow.base_branch: the branch {base!r} does not exist")
    if not cartridge.landing_areas.checks:
        warnings.append("landing_areas.checks is empty: no check tests the agents' changes")
    env = check_env(cartridge.landing_areas.pass_env, environ)  # what a check starts with
    for i, command in enumerate(cartridge.landing_areas.checks):
        problem = check_problem(i, command, env, root)
        if problem is not None:  # every run would pause on it
            missing.append(problem)
    setup = cartridge.landing_areas.setup  # every new worktree would pause on its problem
    if setup and (problem := check_problem(0, setup, env, root, key="landing_areas.setup")):
        missing.append(problem)
    problem = store_server_problem(cartridge.store_url(root))
    if problem is not None:  # every command would stop on it: a problem, not a warning
        missing.append(problem)
