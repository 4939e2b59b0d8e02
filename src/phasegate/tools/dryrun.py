"""``phasegate dry-run``: the repository's whole workflow, offline, on a throwaway clone.

A dry run proves a cartridge before a real ticket spends money: the roles keep
their runner, executable, tools and permissions, but every ``claude-code``,
``codex``, ``gemini``, ``opencode``, ``qwen``, ``copilot``, ``aider``,
``mini-swe-agent`` and ``api`` role talks to a local ``ScriptedModelServer`` (its
``base_url`` and a dummy key replace the real ones) whose turns come from a
script. ``command`` and ``scripted`` roles run as they are. Everything happens
in a ``git clone --local --no-hardlinks`` of the repository in a temporary
directory, with a store of its own, and merges there without asking: the
repository's branches, commits, objects, working tree and ``.phasegate`` state
are never touched. The clone holds what is committed; the cartridge is the
one in the working tree, committed or not.

The script (``--script FILE``) is TOML, one table per script::

    # A role's name plays for that role's prompt. Any other table name is a
    # phrase looked for in the prompt, tried before the roles: it scripts one
    # moment, e.g. "review round 2".
    [review]
    steps = [{ text = "Add a test first.\\nVERDICT: request_changes" }]

    ["review round 2"]
    steps = [{ text = "Good now.\\nVERDICT: approve" }]

    [build]                          # Claude Code's Write tool, then the summary
    steps = [
      { tools = [{ name = "Write", input = { file_path = "{cwd}/hi.txt", content = "hi\\n" } }] },
      { text = "Wrote hi.txt." },
    ]

Each step is one model turn: ``text``, ``tools`` (calls ``{name, input}``:
``Write``/``Edit``/``Read``/``Bash`` for Claude Code, where ``{cwd}`` becomes
the agent's working directory; ``exec_command`` with ``{cmd = "..."}`` for
Codex; ``write_file`` ``{file_path, content}`` for Gemini CLI and Qwen Code;
``write`` ``{filePath, content}`` for opencode; ``bash`` ``{command,
description}`` for Copilot CLI (its edit tools depend on the model: ``create``
``{path, file_text}`` for most, ``apply_patch`` for GPT-5); ``bash``
``{command}`` for mini-swe-agent, whose every turn calls it, the last one with ``echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``; aider edits from the text itself, in
its edit format), ``status`` (an HTTP error status), ``input_tokens``,
``output_tokens``, ``delay_s``, ``hang``. A call plays its script from the
first step; a turn that calls tools is answered by the next step. Roles the
script leaves out get the built-in default: a plan, ``VERDICT: approve``, a
build that writes ``phasegate-dry-run.txt`` with its CLI's own tool (a diff
for ``api``), ``VERDICT: approve`` and ``VERDICT: confirmed``; a
mini-swe-agent role's default turns also submit, as mini needs.

In graph mode (``[graph] enabled = true``) the roles' scripts are picked by
the development graph's prompts (``GRAPH_ROLE_MARKERS``), every role is
read-only, and the built-in build answers with the unified diff whatever its
runner; the graph's optional roles answer acceptably too (a second plan,
``CHOICE: first`` and its price, ``VERDICT: proceed``, ``VERDICT: approve``,
one ``SUBTASK`` line). The plan adversary's revision, asked of the plan's
author, plays the ``plan`` script. The dry run lands the graph's draft PR
without asking, as it merges without asking (``[autonomy]`` gives
``draft_pr_create`` ``auto`` in the clone); failing checks still stop it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phasegate.agents import DEFAULT_EXECUTABLES
from phasegate.config.cartridge import ALL_ROLES, Cartridge, RoleBinding
from phasegate.config.toml import TomlError, read_toml
from phasegate.core.contract import PhasegateError
from phasegate.core.redaction import SECRET_NAME
from phasegate.git.workspace import GitError, git
from phasegate.graph import prompts as graph_prompts
from phasegate.graph.facts import ChangeFacts
from phasegate.phases import acceptance_verification, development, planning, pr_review
from phasegate.testing.model_server import ScriptedModelServer, Step, ToolCall

__all__ = [
    "DRY_RUN_FILE",
    "GRAPH_ROLE_MARKERS",
    "OFFLINE_RUNNERS",
    "ROLE_MARKERS",
    "DryRun",
    "ScriptError",
    "default_scripts",
    "dry_run_workspace",
    "load_script",
    "offline_binding",
    "role_markers",
]

#: Runners whose model the dry run replaces with the scripted model server.
OFFLINE_RUNNERS = (
    "claude-code",
    "codex",
    "gemini",
    "opencode",
    "qwen",
    "copilot",
    "aider",
    "mini-swe-agent",
    "api",
)
#: The file the default build script writes.
DRY_RUN_FILE = "phasegate-dry-run.txt"
DUMMY_KEY = "phasegate-dry-run-key"

_STEP_KEYS = frozenset(
    {"text", "tools", "status", "input_tokens", "output_tokens", "delay_s", "hang"}
)


def _marker(prompt: str) -> str:
    """The opening words of a phase's prompt, up to its first placeholder or full stop."""
    return re.split(r"[.({]", prompt, maxsplit=1)[0].strip()


#: The phrase of each role's prompt that picks its script (from the phases' prompts).
ROLE_MARKERS = {
    "plan": _marker(planning.PLAN_PROMPT),
    "plan_review": _marker(planning.REVIEW_PROMPT),
    "build": _marker(development.BUILD_PROMPT),
    "review": _marker(pr_review.REVIEW_PROMPT),
    "verification": _marker(acceptance_verification.VERIFY_PROMPT),
}

_NO_FACTS = ChangeFacts(files=0, insertions=0, deletions=0, paths=(), governance_paths=())
_CHANGE = ("t", "p", 1, "b", "d", _NO_FACTS, ())
#: The same in graph mode: the development graph's prompts (``phasegate.graph.prompts``)
#: pick the roles' scripts; verification keeps its phase's prompt.
GRAPH_ROLE_MARKERS = {
    "scope_epic": _marker(graph_prompts.scope_prompt("t")),
    "plan": _marker(graph_prompts.plan_prompt("t")),
    "plan_alternative": _marker(graph_prompts.plan_alternative_prompt("t", "p")),
    "plan_arbitrate": _marker(graph_prompts.plan_arbitrate_prompt("t", "p", "q")),
    "plan_adversary": _marker(graph_prompts.plan_adversary_prompt("t", "p")),
    "build": _marker(graph_prompts.build_prompt("t", "p", 1)),
    "review": _marker(graph_prompts.review_prompt(*_CHANGE)),
    "review_adversary": _marker(graph_prompts.adversary_prompt(*_CHANGE, "approve", "f")),
    "arbitrate": _marker(graph_prompts.arbitrate_prompt(*_CHANGE, "r", "a")),
    "verification": ROLE_MARKERS["verification"],
}
#: The plan adversary's revision goes to the plan's author; it plays the plan script.
_PLAN_REVISION_MARKER = _marker(graph_prompts.plan_revision_prompt("t", "p", "o"))


def role_markers(graph: bool) -> dict[str, str]:
    """The marker of each role's prompt: ROLE_MARKERS, or GRAPH_ROLE_MARKERS in graph mode."""
    return dict(GRAPH_ROLE_MARKERS if graph else ROLE_MARKERS)


class ScriptError(PhasegateError):
    """The dry-run script is unreadable or malformed; the message names the key."""


def _step(path: Path, where: str, raw: Any) -> Step:
    if not isinstance(raw, dict):
        raise ScriptError(f'{path}: {where}: a step is a table, e.g. {{ text = "..." }}')
    unknown = sorted(set(raw) - _STEP_KEYS)
    if unknown:
        raise ScriptError(
            f"{path}: {where}.{unknown[0]}: unknown key "
            f"(a step has {', '.join(sorted(_STEP_KEYS))})"
        )
    tools = []
    for i, call in enumerate(raw.get("tools", [])):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{path}: {where}.tools[{i}]: a tool call is {{ name, input }}")
        extra = sorted(set(call) - {"name", "input"})
        if extra:
            raise ScriptError(f"{path}: {where}.tools[{i}].{extra[0]}: unknown key")
        if not isinstance(call.get("input", {}), dict):
            raise ScriptError(f"{path}: {where}.tools[{i}].input: must be a table")
        tools.append(ToolCall(call["name"], call.get("input", {})))
    try:
        return Step(
            text=str(raw.get("text", "")),
            tools=tuple(tools),
            status=int(raw.get("status", 200)),
            input_tokens=int(raw.get("input_tokens", 100)),
            output_tokens=int(raw.get("output_tokens", 20)),
            delay_s=float(raw.get("delay_s", 0.0)),
            hang=bool(raw.get("hang", False)),
        )
    except (TypeError, ValueError) as exc:
        raise ScriptError(f"{path}: {where}: {exc}") from None


def load_script(path: Path) -> dict[str, list[Step]]:
    """Read a dry-run script: ``{table name: steps}`` in file order. Raises ScriptError."""
    try:
        raw = read_toml(path)
    except TomlError as exc:
        raise ScriptError(str(exc)) from None
    scripts: dict[str, list[Step]] = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise ScriptError(f"{path}: {name}: expected a table [{name}] with steps = [...]")
        extra = sorted(set(table) - {"steps"})
        if extra:
            raise ScriptError(f"{path}: {name}.{extra[0]}: unknown key (a script has `steps`)")
        steps = table.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ScriptError(f"{path}: {name}.steps: a non-empty array of steps is needed")
        scripts[name] = [_step(path, f"{name}.steps[{i}]", s) for i, s in enumerate(steps)]
    return scripts


_DIFF = f"""--- /dev/null
+++ b/{DRY_RUN_FILE}
@@ -0,0 +1 @@
+Written by the build agent of a phasegate dry run.
"""


def default_scripts(
    build_runner: str | None, *, graph: bool = False, runners: Mapping[str, str] | None = None
) -> dict[str, list[Step]]:
    """The built-in script: every role answers acceptably; the build writes DRY_RUN_FILE
    with the tool its runner's CLI has (Write, exec_command) or a diff (api).

    ``runners`` (role: runner) names the roles bound to mini-swe-agent, whose every
    turn must call its bash tool: their turns also run the submit command.

    ``graph``: the cartridge runs the development graph, where every role is
    read-only: the build answers with the diff whatever its runner, plan_review
    is not asked, and the graph's optional roles (GRAPH_OPTIONAL_ROLES) answer
    acceptably too: a second plan, ``CHOICE: first`` with a price, the plan
    adversary's ``VERDICT: proceed``, the review adversary's and arbitrator's
    ``VERDICT: approve``, scope_epic's one ``SUBTASK`` line.
    """
    line = "Written by the build agent of a phasegate dry run."
    if graph:
        summary = f"Creates {DRY_RUN_FILE} holding one line; the checks find it."
        graph_scripts = {
            "scope_epic": [Step(text=f"SUBTASK: Create {DRY_RUN_FILE}")],
            "plan": [Step(text=f"1. Create {DRY_RUN_FILE} holding one line.\n2. Nothing else.")],
            "plan_alternative": [
                Step(text=f"1. Write {DRY_RUN_FILE} from a template.\n2. Check that it exists.")
            ],
            "plan_arbitrate": [
                Step(
                    text="The first plan is the smaller change.\nCHOICE: first\n"
                    "PRICE: no template for the file"
                )
            ],
            "plan_adversary": [Step(text="Every claim of the plan holds.\nVERDICT: proceed")],
            "build": [Step(text=f"{summary}\n\n```diff\n{_DIFF}```\n")],
            "review": [Step(text="Correct and minimal.\nVERDICT: approve")],
            "review_adversary": [
                Step(text="Nothing the reviewer missed; no objection stands.\nVERDICT: approve")
            ],
            "arbitrate": [
                Step(text="The reviewer's approval holds against the adversary.\nVERDICT: approve")
            ],
            "verification": [
                Step(text="The change does what the ticket asks.\nVERDICT: confirmed")
            ],
        }
        return _submitting(graph_scripts, runners)
    if build_runner == "codex":
        shell = f"printf '%s\\n' '{line}' > {DRY_RUN_FILE}"
        build = [
            Step(tools=(ToolCall("exec_command", {"cmd": shell}),)),
            Step(text=f"Created {DRY_RUN_FILE}."),
        ]
    elif build_runner == "api":
        build = [Step(text=f"```diff\n{_DIFF}```\n")]
    elif build_runner in ("gemini", "qwen"):
        write = ToolCall("write_file", {"file_path": "{cwd}/" + DRY_RUN_FILE, "content": line})
        build = [Step(tools=(write,)), Step(text=f"Created {DRY_RUN_FILE}.")]
    elif build_runner in ("copilot", "mini-swe-agent"):
        # Copilot's edit tools follow the model (a GPT-5 gets apply_patch, not create);
        # its bash is offered to every model.
        shell = f"printf '%s\\n' '{line}' > {DRY_RUN_FILE}"
        run = ToolCall("bash", {"command": shell, "description": "write the file"})
        build = [Step(text="Writing it.", tools=(run,)), Step(text=f"Created {DRY_RUN_FILE}.")]
    elif build_runner == "opencode":
        write = ToolCall("write", {"filePath": DRY_RUN_FILE, "content": line + "\n"})
        build = [Step(tools=(write,)), Step(text=f"Created {DRY_RUN_FILE}.")]
    elif build_runner == "aider":
        # aider's "whole" edit format: the file's name, then its whole content fenced
        build = [Step(text=f"Creating it.\n\n{DRY_RUN_FILE}\n```\n{line}\n```\n")]
    else:
        write = ToolCall("Write", {"file_path": "{cwd}/" + DRY_RUN_FILE, "content": line + "\n"})
        build = [Step(tools=(write,)), Step(text=f"Created {DRY_RUN_FILE}.")]
    return _submitting(
        {
            "plan": [Step(text=f"1. Create {DRY_RUN_FILE} holding one line.\n2. Nothing else.")],
            "plan_review": [Step(text="The plan is sound and testable.\nVERDICT: approve")],
            "build": build,
            "review": [Step(text="Correct and minimal.\nVERDICT: approve")],
            "verification": [
                Step(text="The change does what the ticket asks.\nVERDICT: confirmed")
            ],
        },
        runners,
    )


#: mini-swe-agent's submit command: a turn that runs it ends the call, its text the answer.
_SUBMIT = ToolCall("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})


def _submitting(
    scripts: dict[str, list[Step]], runners: Mapping[str, str] | None
) -> dict[str, list[Step]]:
    """``scripts`` with each mini-swe-agent role's turns that call no tool running the
    submit command: mini takes a turn without a bash call for a format error."""
    for role, runner in (runners or {}).items():
        if runner == "mini-swe-agent" and role in scripts:
            scripts[role] = [
                step if step.tools else replace(step, tools=(_SUBMIT,)) for step in scripts[role]
            ]
    return scripts


def offline_binding(binding: RoleBinding, url: str) -> RoleBinding:
    """``binding`` pointed at the scripted model server at ``url``, with a dummy key.

    Runner, executable, tools, permissions, limits and timeouts are kept. The
    real key's variable is dropped (``api_key_env``, secrets in ``pass_env``),
    and the CLIs are told not to retry, so a scripted error ends the call.
    """
    if binding.runner not in OFFLINE_RUNNERS:
        return binding
    data = binding.model_dump(exclude_unset=True)
    data["pass_env"] = [n for n in binding.pass_env if not SECRET_NAME.search(n)]
    env = {k: v for k, v in binding.env.items() if not SECRET_NAME.search(k)}
    if binding.runner == "claude-code":
        data.update(base_url=url, api_key_env=None)
        env.update(ANTHROPIC_API_KEY=DUMMY_KEY, CLAUDE_CODE_MAX_RETRIES="0")
    elif binding.runner == "codex":
        data.update(base_url=f"{url}/v1", api_key_env=None)  # codex reads OPENAI_API_KEY then
        env["OPENAI_API_KEY"] = DUMMY_KEY
        data["extra_args"] = [
            *binding.extra_args,
            "-c",
            "model_providers.phasegate.request_max_retries=0",
            "-c",
            "model_providers.phasegate.stream_max_retries=0",
        ]
    elif binding.runner == "gemini":
        data.update(base_url=url, api_key_env=None)  # the server speaks Gemini's API
        env["GEMINI_API_KEY"] = DUMMY_KEY
    elif binding.runner in ("opencode", "qwen", "copilot"):
        # An OpenAI-compatible provider, the model the binding's own id.
        name = (binding.model or "dry-run-model").rpartition("/")[2]
        data.update(base_url=f"{url}/v1", model=name, api_key_env="PHASEGATE_DRY_RUN_API_KEY")
        env["PHASEGATE_DRY_RUN_API_KEY"] = DUMMY_KEY
    else:
        if binding.runner == "mini-swe-agent":
            # One try a model call: mini's own retries, and the OpenAI client's under it.
            env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = "1"
            data["extra_args"] = [*binding.extra_args, "-c", "model.model_kwargs.max_retries=0"]
        if binding.runner == "aider":
            # Its edit format follows the model (gpt-5: search/replace blocks); the
            # built-in build answers in the "whole" one, which aider takes from any model.
            data["extra_args"] = [*binding.extra_args, "--edit-format", "whole"]
        # The server speaks Anthropic messages and OpenAI chat completions: a model
        # of another provider is called as an OpenAI-compatible one of the same name.
        model = binding.model or ""
        provider, _, name = model.rpartition("/")
        if provider == "anthropic" or (not provider and name.startswith("claude")):
            data["base_url"] = url  # litellm appends /v1/messages
        else:
            data.update(base_url=f"{url}/v1", model=f"openai/{name}")
        data["api_key_env"] = "PHASEGATE_DRY_RUN_API_KEY"
        env["PHASEGATE_DRY_RUN_API_KEY"] = DUMMY_KEY
    data["env"] = env
    return RoleBinding.model_validate(data)


@dataclass
class DryRun:
    """A prepared dry run: the clone, the offline cartridge and the running server."""

    repo: Path
    clone: Path
    cartridge: Cartridge
    server: ScriptedModelServer
    offline_roles: list[str] = field(default_factory=list)
    as_is_roles: list[str] = field(default_factory=list)

    def model_requests(self) -> int:
        return sum(1 for r in self.server.requests if r.script)


def _clone(repo: Path, base: str | None, into: Path) -> Path:
    """A ``git clone --local`` of ``repo`` with no remote, its identity and ``.phasegate/``
    excluded, on ``base`` (or the repository's current branch)."""
    try:
        git(["rev-parse", "--verify", "-q", "HEAD"], repo)
    except GitError:
        raise PhasegateError(f"{repo} has no commit yet; a dry run clones its branches") from None
    clone = into / repo.name
    branch = ["--branch", base] if base else []
    try:
        # Copies, not hard links: git "freshens" (touches) an object it writes again,
        # and a hard-linked object is the repository's own file.
        git(["clone", "-q", "--local", "--no-hardlinks", *branch, str(repo), str(clone)], into)
    except GitError as exc:
        raise PhasegateError(f"cannot clone {repo} for the dry run: {exc}") from None
    git(["remote", "remove", "origin"], clone)  # nothing the dry run does can reach the repo
    for key in ("user.name", "user.email"):
        value = git(["config", key], repo, check=False)
        if value:
            git(["config", key, value], clone)
    exclude = clone / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a", encoding="utf-8") as fh:
        fh.write("\n.phasegate/\n")
    return clone


def _offline_cartridge(
    cartridge: Cartridge, repo: Path, url: str
) -> tuple[Cartridge, list[str], list[str]]:
    """The cartridge the dry run uses: offline roles, the clone's own store, and in graph
    mode the draft PR landed without asking (as the dry run merges without asking)."""
    roles: dict[str, Any] = {}
    offline, as_is = [], []
    for name in ALL_ROLES:
        binding = getattr(cartridge.roles, name)
        if binding is None:
            continue
        if binding.runner in OFFLINE_RUNNERS:
            binding = offline_binding(binding, url)
            offline.append(name)
        else:
            as_is.append(name)
            if binding.runner == "scripted" and binding.script:
                # The clone holds committed files only; the script may not be committed.
                script = Path(binding.script)
                script = script if script.is_absolute() else repo / script
                data = binding.model_dump(exclude_unset=True)
                binding = RoleBinding.model_validate({**data, "script": str(script)})
        roles[name] = binding
    update: dict[str, Any] = {
        "roles": cartridge.roles.model_copy(update=roles),
        "store": cartridge.store.model_copy(update={"url": None}),  # the clone's own SQLite
    }
    if cartridge.graph.enabled:
        policy = {**cartridge.autonomy.policy, "draft_pr_create": "auto"}
        update["autonomy"] = cartridge.autonomy.model_copy(update={"policy": policy})
    updated = cartridge.model_copy(update=update)
    return updated, offline, as_is


def _preflight(cartridge: Cartridge) -> None:
    """What the roles need that the dry run cannot replace: their CLIs, and litellm."""
    problems = []
    for name in cartridge.workflow_roles():
        binding = getattr(cartridge.roles, name)
        if binding is None:
            continue
        exe = binding.executable or DEFAULT_EXECUTABLES.get(binding.runner)
        if binding.runner in DEFAULT_EXECUTABLES and exe and shutil.which(exe) is None:
            problems.append(f"roles.{name}: the {binding.runner} executable `{exe}` is not found")
        if binding.runner not in (*OFFLINE_RUNNERS, "command", "scripted"):
            # Run as it is, it would call its real model with the real key.
            problems.append(
                f"roles.{name}: a dry run cannot point the {binding.runner} runner at the "
                "scripted model"
            )
        if binding.runner == "api" and importlib.util.find_spec("litellm") is None:
            problems.append(
                f"roles.{name}: the api runner needs litellm: pip install 'phasegate[api]'"
            )
    if problems:
        raise PhasegateError("; ".join(problems) + " (`phasegate doctor` lists what is missing)")


@contextmanager
def dry_run_workspace(
    repo: Path,
    cartridge: Cartridge,
    script: Mapping[str, Sequence[Step]] | None = None,
    *,
    keep: bool = False,
) -> Iterator[DryRun]:
    """Clone ``repo``, start the scripted model server and yield the prepared DryRun.

    ``script`` tables named after a role replace that role's default; other
    names are markers, tried first. In graph mode the roles' markers are the
    graph's prompts (GRAPH_ROLE_MARKERS). On exit the server stops and the clone is
    removed, unless ``keep``. Raises PhasegateError when a role's CLI (or litellm)
    is missing, or the clone cannot be made.
    """
    _preflight(cartridge)
    script = dict(script or {})
    build = cartridge.roles.build
    graph = cartridge.graph.enabled
    runners = {
        name: binding.runner
        for name in ALL_ROLES
        if (binding := getattr(cartridge.roles, name)) is not None
    }
    defaults = default_scripts(build.runner if build else None, graph=graph, runners=runners)
    roles = set(ALL_ROLES)
    scripts: dict[str, Sequence[Step]] = {
        marker: steps for marker, steps in script.items() if marker not in roles
    }
    for role, marker in role_markers(graph).items():
        scripts[marker] = script.get(role) or defaults[role]
    if graph:
        scripts.setdefault(_PLAN_REVISION_MARKER, script.get("plan") or defaults["plan"])
    tmp = Path(tempfile.mkdtemp(prefix="phasegate-dry-run-"))
    server: ScriptedModelServer | None = None
    try:
        clone = _clone(repo, cartridge.workflow.base_branch, tmp)
        server = ScriptedModelServer(scripts).start()
        offline, names, as_is = _offline_cartridge(cartridge, repo, server.url)
        yield DryRun(repo, clone, offline, server, names, as_is)
    finally:
        if server is not None:
            server.stop()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
