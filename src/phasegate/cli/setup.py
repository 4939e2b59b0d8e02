"""Setting up: ``init``, ``doctor``, ``dry-run``."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from phasegate.cli._app import (
    JsonOption,
    RepoOption,
    UsageError,
    app,
    console,
    repo_root,
    reported_errors,
    shown,
    ticket_from,
)

if TYPE_CHECKING:
    from phasegate.tools.doctor import Diagnosis
    from phasegate.tools.init import DefaultCartridge


@app.command(short_help="Write phasegate.toml, from what it finds.")
def init(
    repo: RepoOption = Path("."),
    force: Annotated[bool, typer.Option(help="Overwrite an existing cartridge.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Write phasegate.toml, with roles and checks chosen from what it finds.

    Roles: the claude-code runner when `claude` is on PATH, else codex when
    `codex` is, else gemini when `gemini` is, else the api runner when
    ANTHROPIC_API_KEY or OPENAI_API_KEY is set; every other agent CLI found
    (opencode, qwen, copilot, aider, mini) is named in a note, to bind with its
    model (docs/runners.md). With none of them, every role runs the sample
    agent, a stand-in installed with phasegate (`"$PHASEGATE_PYTHON" -P -m
    phasegate.tools.sample_agent` on the command runner; no file is written for
    it): it answers by rule, calls no model and spends nothing, so `phasegate
    run` shows a whole workflow at once. The base branch and the checks
    (pytest, npm test, cargo test, go test, make test) come from the
    repository. To bind a real agent later, edit [agents.sample] or the
    [roles.NAME] tables (docs/runners.md); --force starts over.
    """
    from phasegate.config.cartridge import CARTRIDGE_FILE, load_cartridge
    from phasegate.git.workspace import Workspace
    from phasegate.tools.init import default_cartridge

    with reported_errors():
        root = repo_root(repo)
        path = root / CARTRIDGE_FILE
        if path.exists() and not force:
            raise UsageError(f"{path} exists; use --force to overwrite")
        chosen = default_cartridge(root)
        Workspace().exclude(root, ".phasegate/")  # the worktrees and the store go there
        path.write_text(chosen.text, encoding="utf-8")
        load_cartridge(root)
    if as_json:
        console.print_json(json.dumps(_chosen_json(chosen, root, path)))
        return
    console.print(f"wrote {path}", highlight=False)
    _print_chosen(chosen, root)


def _check_problems(chosen: "DefaultCartridge", root: Path) -> list[str | None]:
    """What doctor would say of each check at once (None: it can run): every build
    would fail on a check that cannot run."""
    from phasegate.agents.env import check_env
    from phasegate.git.check_probe import program_problem

    return [program_problem(check.command, check_env(), root) for check in chosen.checks]


def _chosen_json(chosen: "DefaultCartridge", root: Path, path: Path) -> dict[str, Any]:
    from phasegate.tools.init import next_steps

    return {
        "cartridge": str(path),
        "roles": {
            "runner": chosen.runner,
            "executable": chosen.executable,
            "model": chosen.model,
            "api_key_env": chosen.api_key_env,
        },
        "sample_agent": {"command": chosen.command, "calls_a_model": False}
        if chosen.sample_agent
        else None,
        "base_branch": {"name": chosen.base_branch, "why": chosen.base_branch_why},
        "checks": [
            {"command": check.command, "why": check.why, "problem": problem}
            for check, problem in zip(chosen.checks, _check_problems(chosen, root), strict=True)
        ],
        "notes": list(chosen.notes),
        "next": next_steps(chosen),
    }


def _print_chosen(chosen: "DefaultCartridge", root: Path) -> None:
    from phasegate.tools.init import next_steps

    def say(label: str, text: str) -> None:
        console.print(f"  {label}: {shown(text)}", highlight=False)

    if chosen.sample_agent:
        say(
            "roles",
            f"every role runs the sample agent ({chosen.command}) on the command runner: "
            "a stand-in installed with phasegate that answers by rule, calls no model, "
            "spends nothing",
        )
    else:
        how = [f"every role on the {chosen.runner} runner"]
        if chosen.executable:
            how.append(f"{chosen.executable}")
        if chosen.model:
            how.append(f"model {chosen.model}")
        how.append(
            f"api_key_env = {chosen.api_key_env}" if chosen.api_key_env else "no api_key_env"
        )
        say("roles", ", ".join(how))
    say("base branch", f"{chosen.base_branch} ({chosen.base_branch_why})")
    if chosen.checks:
        for check, problem in zip(chosen.checks, _check_problems(chosen, root), strict=True):
            say("check", f"{check.command}  ({check.why})")
            if problem is not None:
                console.print(
                    f"    [yellow]it cannot run yet:[/yellow] {shown(problem)}", highlight=False
                )
    else:
        say("checks", "none found")
    for note in chosen.notes:
        console.print(f"  [yellow]note:[/yellow] {shown(note)}", highlight=False)
    console.print("next:", highlight=False)
    for step in next_steps(chosen):
        console.print(f"  {shown(step)}", highlight=False)


@app.command(short_help="Check what a run needs; list what is missing.")
def doctor(
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
    offline: Annotated[
        bool,
        typer.Option(
            help="Send nothing to the forge (GitHub, GitLab or Gitea): skip the lookup "
            "of the repository."
        ),
    ] = False,
) -> None:
    """Check agent CLIs, model keys, git and the cartridge: is a run ready?

    What a run needs: agent CLIs, model keys, git, the cartridge and its roles.

    Lists the agent CLIs found on PATH (claude, codex, gemini, opencode, qwen,
    copilot, aider, mini, and every executable the cartridge names) with their
    versions, which model keys are set (never
    their values), the git version, whether the cartridge is valid, what each
    role is bound to, and what is missing. Exit code 0 when everything a run
    needs is there, 1 when something is missing.

    With forge.kind = "github" it asks GitHub once, read-only, for the
    repository (GET /repos/OWNER/NAME) with the cartridge's credentials: a
    refused token, a repository the token cannot see, or one it can read but
    not push to is missing; GitHub out of reach is a warning. With
    forge.kind = "gitlab" it asks for the project (GET /projects/ID): a role
    below Developer is missing. With forge.kind = "gitea" (Gitea or Forgejo)
    it asks for the repository (GET /api/v1/repos/OWNER/NAME): a token whose
    account cannot push, or push but not administer, is missing. --offline
    skips that lookup.
    """
    from phasegate.tools.doctor import diagnose

    found = diagnose(repo, offline=offline)
    if as_json:
        shown = found.as_dict()
        if not found.ok:  # a script reads every --json failure the same way
            said = "; ".join(found.missing) or "a run is not ready"
            shown["error"] = {"message": f"missing: {said}", "kind": "NotReady"}
        console.print_json(json.dumps(shown))
    else:
        _print_diagnosis(found)
    if not found.ok:
        raise typer.Exit(1)


#: How doctor names each team forge.
_FORGE_NAMES = {"github": "GitHub", "gitea": "Gitea", "gitlab": "GitLab"}


def _print_diagnosis(found: "Diagnosis") -> None:
    def line(mark: str, text: str) -> None:
        console.print(f"  {mark} {shown(text)}", highlight=False)

    yes, no = "[green]✓[/green]", "[red]✗[/red]"
    console.print(
        f"phasegate {found.phasegate} · git {found.git or 'not found'} · "
        f"repo {found.repo or 'none'}",
        highlight=False,
    )
    console.print("[bold]agent CLIs[/bold]")
    for cli in found.agent_clis:
        if cli.path is None:
            line("[dim]−[/dim]", f"{cli.name}: not found")
        else:
            where = cli.path if cli.path == cli.name else f"{cli.name}: {cli.path}"
            line(yes if cli.version else no, f"{where}  {cli.version or cli.error}")
    console.print("[bold]model keys[/bold] (whether set; values are never shown)")
    is_set = [name for name, ok in found.keys.items() if ok]
    unset = [name for name, ok in found.keys.items() if not ok]
    line(yes if is_set else "[dim]−[/dim]", "set: " + (", ".join(is_set) or "none"))
    line("[dim]−[/dim]", "not set: " + (", ".join(unset) or "none"))
    cart = found.cartridge
    if cart["path"]:
        state = "valid" if cart["valid"] else ("invalid" if cart["found"] else "not found")
        console.print(f"[bold]cartridge[/bold] {shown(cart['path'])}: {state}", highlight=False)
    if found.roles:
        console.print("[bold]roles[/bold]")
    for role in found.roles:
        if not role.bound:
            line(no, f"{role.role}: not bound")
        elif role.error:
            line(no, f"{role.role}: {role.error}")
        else:
            parts = [role.runner or "?"]
            if role.agent:
                parts[0] = f"agent {role.agent} ({role.runner})"
            if role.model:
                parts.append(f"model {role.model}")
            if role.executable and role.executable != role.resolved:
                parts.append(f"{role.executable} → {role.resolved or 'NOT FOUND'}")
            elif role.executable:
                parts.append(role.executable)
            if role.api_key_env:
                parts.append(f"{role.api_key_env} {'set' if role.api_key_set else 'NOT SET'}")
            if role.sandbox:
                parts.append(f"sandbox {role.sandbox} ({role.sandbox_reason})")
            if role.mcp_servers:
                servers = [f"{n} {where or 'NOT FOUND'}" for n, where in role.mcp_servers.items()]
                parts.append("mcp " + ", ".join(servers))
            problem = (
                (role.executable and not role.resolved)
                or (role.api_key_env and not role.api_key_set)
                or None in role.mcp_servers.values()
            )
            line(no if problem else yes, f"{role.role}: " + " · ".join(parts))
    if found.checks_sandbox:
        sandbox = found.checks_sandbox
        line("•", f"checks: sandbox {sandbox['kind']} ({sandbox['reason']})")
    if found.forge.get("kind", "local") != "local":
        forge = found.forge
        access = forge.get("access", "unknown")
        ready = "repository" in forge and "credentials" in forge and access != "read"
        ready = ready and not [m for m in found.missing if m.startswith("forge:")]
        where = forge.get("repository", "repository unknown")
        said = {"admin": ", administers it", "push": ", may push", "read": ", may NOT push"}
        line(
            yes if ready else no,
            f"forge: {_FORGE_NAMES.get(forge['kind'], forge['kind'])} {where} at {forge['api']}, "
            f"{forge.get('credentials', 'no credentials')}{said.get(access, '')}",
        )
    elif found.forge:
        line("•", "forge: local (issues and pull requests in the store)")
    line(
        yes if found.litellm else "[dim]−[/dim]",
        f"litellm {'installed' if found.litellm else 'not installed'} (for api roles)",
    )
    for warning in found.warnings:
        line("[yellow]![/yellow]", warning)
    if found.missing:
        console.print(f"[red]missing ({len(found.missing)})[/red]")
        for item in found.missing:
            line(no, item)
    else:
        console.print("[green]ready[/green]: everything a run needs is there")


@app.command(
    "dry-run",
    short_help="Run a workflow offline, on a throwaway clone.",
    epilog="The script format, and what the dry run keeps and replaces: docs/doctor-dry-run.md.",
)
def dry_run(
    ticket: Annotated[str | None, typer.Argument(help="The ticket text.")] = None,
    ticket_file: Annotated[
        Path | None, typer.Option("--ticket", help="Read the ticket from FILE.")
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option(help="The model's turns per role, a TOML file (default: built-in)."),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary clone (and its state) afterwards.")
    ] = False,
    repo: RepoOption = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Run a whole workflow offline: a scripted model, a throwaway clone.

    Every claude-code, codex, gemini, opencode, aider and api role keeps its
    runner, executable, tools and permissions but talks to a local scripted
    model server (base_url and a dummy key are replaced); command and scripted
    roles run as they are; a qwen, copilot or mini role is refused (no offline
    method yet). The
    work happens in a local clone (git clone --local --no-hardlinks) in a
    temporary directory with its own store, and merges there without asking:
    the repository is never touched.

    The script is TOML, one table per role (plan, plan_review, build, review,
    verification) or per phrase of a prompt (tried first), each with steps,
    one per model turn:

    \b
        [review]
        steps = [{ text = "Needs a test.\\nVERDICT: request_changes" }]
        ["review round 2"]
        steps = [{ text = "VERDICT: approve" }]
        [build]
        steps = [
          { tools = [{ name = "Write", input = { file_path = "{cwd}/a.txt", content = "a" } }] },
          { text = "Wrote a.txt." },
        ]

    A step has text, tools ([{name, input}]: Write/Edit/Read/Bash for Claude
    Code, {cwd} being its working directory; exec_command {cmd} for Codex),
    status (an HTTP error), input_tokens, output_tokens, delay_s, hang. Roles
    left out answer acceptably: a plan, VERDICT: approve, a build writing
    phasegate-dry-run.txt, VERDICT: confirmed.

    In graph mode ([graph] enabled = true) the roles' scripts are picked by the
    development graph's prompts and every role is read-only: the built-in build
    answers with a unified diff, the bound graph roles (scope_epic,
    plan_alternative, plan_arbitrate, plan_adversary, review_adversary,
    arbitrate) answer acceptably, and the draft PR is landed without asking.
    """
    from phasegate.cli.detail import print_detail
    from phasegate.cli.render import STOPPED, LiveProgress, graceful, make_engine
    from phasegate.config.cartridge import CARTRIDGE_FILE, load_cartridge
    from phasegate.operations import title_of
    from phasegate.store import open_store
    from phasegate.summary import workflow_detail
    from phasegate.tools.dryrun import dry_run_workspace, load_script

    with reported_errors():
        text = ticket_from(ticket, ticket_file)
        root = repo_root(repo)
        cartridge = load_cartridge(root)
        cartridge.require_roles(root / CARTRIDGE_FILE)
        steps = load_script(script) if script is not None else None
        with dry_run_workspace(root, cartridge, steps, keep=keep) as dry:
            store = open_store(dry.cartridge.store_url(dry.clone))
            try:
                engine = make_engine(dry.clone, dry.cartridge, store, None, notifying=False)
                if not as_json:
                    console.print(
                        f"dry run on a clone of {root}: {dry.clone}\n"
                        f"  scripted model at {dry.server.url} for: "
                        f"{', '.join(dry.offline_roles) or 'no role'}"
                        + (
                            f"; as they are: {', '.join(dry.as_is_roles)}"
                            if dry.as_is_roles
                            else ""
                        ),
                        highlight=False,
                    )
                workflow_id = engine.start(title_of(text), text, auto_merge=True)
                stopping = "stopping: the running agent or check is stopped; the dry run ends " + (
                    f"and keeps its clone ({dry.clone})" if keep else "and removes its clone"
                )
                with (
                    LiveProgress(quiet=as_json) as progress,
                    graceful(engine, notice=lambda: stopping),
                ):
                    engine.on_event = progress
                    engine.advance(workflow_id)
                detail = workflow_detail(store, workflow_id)
            finally:
                store.close()
            requests = dry.model_requests()
            clone = str(dry.clone)
    info = {
        "repo": str(root),
        "clone": clone,
        "kept": keep,
        "script": str(script) if script else None,
        "model_requests": requests,
        "offline_roles": dry.offline_roles,
        "as_is_roles": dry.as_is_roles,
    }
    summary = detail["workflow"]
    if as_json:
        console.print_json(json.dumps({"dry_run": info, **detail}, default=str))
    else:
        console.print()
        print_detail(detail)
        color = "green" if summary["status"] in ("completed", "waiting") else "red"
        console.print(
            f"\ndry run: {summary['current_phase']} · [{color}]{summary['status']}[/{color}] · "
            f"{requests} model request(s) answered by the script",
            highlight=False,
        )
        if summary["error"]:
            console.print(f"  reason: {shown(summary['error'])}", highlight=False)
        if summary["status"] not in ("completed", "failed") or engine.shutdown.is_set():
            # What a person would do next acts on the clone's workflow, not the repository's.
            console.print(
                f"  commands above naming {summary['id']} act on the clone's workflow: add "
                f"`--repo {clone}`"
                if keep
                else f"  commands above naming {summary['id']} named the clone's workflow, which "
                "is gone: change what stopped it, then dry-run again (`--keep` keeps the "
                "clone to go on in it)",
                highlight=False,
            )
        where = f"kept in {clone}" if keep else "removed (--keep keeps it)"
        console.print(f"  {root} was not touched; the clone was {where}", highlight=False)
    if engine.shutdown.is_set():
        raise typer.Exit(130)
    if summary["status"] in STOPPED:
        raise typer.Exit(1)
