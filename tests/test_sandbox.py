"""Agents and checks in a bubblewrap sandbox: real bwrap,
real processes, real workflows through the real CLI."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import test_mini_swe_agent_runner as mswe
import test_real_agents as real

from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.command import CommandRunner
from phasegate.config.cartridge import RoleBinding
from phasegate.git.checks import run_checks
from phasegate.proc.process import kill_orphan_group, run_supervised, start_ticks
from phasegate.proc.sandbox import (
    agent_confinement,
    bwrap_works,
    check_confinement,
    confinement,
    refused_writes,
)
from phasegate.testing.model_server import Step, ToolCall
from phasegate.tools.doctor import diagnose

import agent_cli_kit
from conftest import agent_cli, git, make_repo, phasegate_cli, scripted_cartridge

WHY_NOT = bwrap_works()
pytestmark = [
    pytest.mark.sandboxed,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"bubblewrap does not work here: {WHY_NOT}"),
]

SENTINEL = "sentinel-of-phasegate-9f2c7e"

HAPPY = """
[[plan]]
text = "1. Write feature.txt"
[[plan_review]]
text = "VERDICT: approve"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""

#: A build agent that tries every way out, then does its own work.
ESCAPE = r"""
import os, re, sys
home, git_config, other, outside = sys.argv[1:5]
prompt = sys.stdin.read()
tried = []
for path in (os.path.join(home, "x"), git_config, os.path.join(other, "planted.txt"), outside):
    try:
        with open(path, "a") as f:
            f.write("escaped\n")
        tried.append(f"WROTE {path}")
    except OSError as exc:
        print(exc, file=sys.stderr)  # "[Errno 30] Read-only file system: '...'"
        tried.append(f"refused {path}")
pid = re.search(r"phasegate pid (\d+)", prompt).group(1)
try:
    environ = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
except OSError as exc:
    environ = f"unreadable: {exc}"
# Every process it can see, in case phasegate hides under another pid.
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            environ += open(f"/proc/{entry}/environ", "rb").read().decode(errors="replace")
        except OSError:
            pass
with open("feature.txt", "w") as f:
    f.write("the feature\n")
with open("report.txt", "w") as f:
    f.write("\n".join(tried) + "\nENVIRON " + environ + "\n")
print("built")
"""


def project(tmp_path: Path, build: str, *, checks: list[str] | None = None) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY)
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=checks, role_overrides={"build": build})
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def toml_string(text: str) -> str:
    return json.dumps(text)


def phasegate_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home), "PHASEGATE_SENTINEL_TOKEN": SENTINEL}


def run_ticket(repo: Path, env: dict[str, str], ticket: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "phasegate"
    # exec keeps the shell's pid ($$): the agent learns phasegate's own pid from its ticket.
    script = f'exec {exe} run --repo {repo} --json "{ticket} (phasegate pid $$)"'
    return subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=180
    )


def test_a_sandboxed_build_agent_changes_its_worktree_and_nothing_else(tmp_path: Path) -> None:
    env = phasegate_env(tmp_path)
    agent = tmp_path / "escape.py"
    agent.write_text(ESCAPE)
    repo_dir = tmp_path / "repo"
    other = tmp_path / "other-worktree"
    outside = tmp_path / "outside.txt"
    git_config = repo_dir / ".git" / "config"
    argv = [sys.executable, agent, env["HOME"], git_config, other, outside]
    build = (
        f'runner = "command"\ncommand = {toml_string(" ".join(map(str, argv)))}\n'
        'timeout = 60\nsandbox = "bwrap"\n'
    )
    repo = project(tmp_path, build)
    git(repo, "worktree", "add", "-q", str(other), "-b", "other")
    config_before = git_config.read_bytes()

    main_before = git(repo, "rev-parse", "main")
    proc = run_ticket(repo, env, "add the feature")

    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # The sandbox refused writes in the build's last attempt: no unattended merge.
    assert summary["status"] == "waiting", summary
    assert git(repo, "rev-parse", "main") == main_before
    held = json.loads(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json").stdout)
    assert held["merge_hold"]["reason"] == (
        "merge held for a person: 4 violation(s) this round: sandbox_denied"
    )
    approve = phasegate_cli("approve-merge", summary["id"], "--repo", str(repo), "--json", env=env)
    assert json.loads(approve.stdout)["status"] == "completed", approve.stdout + approve.stderr
    # On the host: nothing escaped, the agent's own edit landed once a person said so.
    assert not (Path(env["HOME"]) / "x").exists()
    assert git_config.read_bytes() == config_before
    assert not (other / "planted.txt").exists()
    assert not outside.exists()
    assert git(repo, "show", "main:feature.txt") == "the feature"
    report = git(repo, "show", "main:report.txt")
    assert "WROTE" not in report and report.count("refused") == 4
    assert "ENVIRON unreadable" in report
    assert SENTINEL not in report
    # Each refused write is a named violation that show prints.
    detail = json.loads(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json").stdout)
    denied = [v for v in detail["violations"] if v["name"] == "sandbox_denied"]
    assert sorted(p for v in denied for p in v["paths"]) == sorted(
        str(p) for p in (Path(env["HOME"]) / "x", git_config, other / "planted.txt", outside)
    )
    assert {v["role"] for v in denied} == {"build"}
    shown = phasegate_cli("show", summary["id"], "--repo", str(repo)).stdout
    assert "violations (4)" in shown and "sandbox_denied · build" in shown
    assert SENTINEL not in proc.stdout + proc.stderr


def test_sandbox_none_runs_unconfined_with_a_loud_warning(tmp_path: Path) -> None:
    marker = tmp_path / "unconfined.txt"
    command = f"echo out > {marker}; echo the feature > feature.txt; echo built"
    build = f'runner = "command"\ncommand = {toml_string(command)}\nsandbox = "none"\n'
    repo = project(tmp_path, build)
    proc = run_ticket(repo, phasegate_env(tmp_path), "add the feature")
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "out\n"  # it could write outside: unconfined
    assert proc.stderr.count("UNCONFINED") == 1
    assert "roles.build" in proc.stderr and 'sandbox = "none"' in proc.stderr
    assert "roles.review" not in proc.stderr  # scripted: no process to confine


def test_doctor_names_each_roles_sandbox_and_refuses_a_bwrap_that_cannot_work(
    tmp_path: Path,
) -> None:
    build = 'runner = "command"\ncommand = "true"\nsandbox = "bwrap"\n'
    repo = project(tmp_path, build, checks=["true"])
    text = (
        (repo / "phasegate.toml")
        .read_text()
        .replace(
            '[roles.review]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n',
            '[roles.review]\nrunner = "command"\ncommand = "true"\nsandbox = "none"\n',
        )
    )
    (repo / "phasegate.toml").write_text(text)
    found = {r.role: (r.sandbox, r.sandbox_reason) for r in diagnose(repo).roles}
    assert found["build"] == ("bwrap", 'sandbox = "bwrap"')
    assert found["review"] == ("none", 'sandbox = "none" in the cartridge')
    assert found["plan"] == (None, None)  # scripted: runs in phasegate, no process
    wide = {**os.environ, "COLUMNS": "200"}
    shown = phasegate_cli("doctor", "--repo", str(repo), env=wide).stdout.splitlines()
    assert any("build: command" in s and 'sandbox bwrap (sandbox = "bwrap")' in s for s in shown)
    assert any("review: command" in s and "sandbox none" in s for s in shown)
    assert any("checks: sandbox bwrap" in s for s in shown)
    assert any("roles.review runs UNCONFINED" in s for s in shown)

    # A bwrap that fails on this machine (a wrapper on PATH causes it): the key is named.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: no permission to unshare' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    env = {**wide, "PATH": f"{fake}:{os.environ['PATH']}"}
    doctor = phasegate_cli("doctor", "--repo", str(repo), env=env)
    assert doctor.returncode == 1
    assert 'roles.build.sandbox = "bwrap", but it is unavailable' in doctor.stdout
    assert "no permission to unshare" in doctor.stdout
    run = phasegate_cli("run", "--repo", str(repo), "a ticket", env=env)
    assert run.returncode == 2, run.stdout + run.stderr
    assert 'roles.build.sandbox = "bwrap"' in run.stderr + run.stdout
    # A machine default run refuses, doctor reports missing too (fresh-user trial).
    bogus = {**os.environ, "COLUMNS": "200", "PHASEGATE_SANDBOX": "bogus"}
    doctor = phasegate_cli("doctor", "--repo", str(repo), env=bogus)
    assert doctor.returncode == 1 and "PHASEGATE_SANDBOX='bogus'" in doctor.stdout


# -- the runner and the checks, directly -------------------------------------------------


def request(tmp_path: Path, *, network: bool = True, timeout_s: float = 30) -> AgentRequest:
    worktree = tmp_path / "wt"
    worktree.mkdir(exist_ok=True)
    return AgentRequest(
        workflow_id="w1",
        phase="development",
        role="build",
        session_line="main",
        prompt="do it",
        cwd=worktree,
        timeout_s=timeout_s,
        read_only=False,
        confinement=agent_confinement(
            "bwrap", network=network, cwd=worktree, state_dir=None, repo=tmp_path
        ),
    )


def command_runner(command: str) -> CommandRunner:
    return CommandRunner(RoleBinding(runner="command", command=command))


def test_network_false_cuts_a_connection_to_a_local_server(tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[bytes] = []

    def serve() -> None:
        server.settimeout(10)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn.recv(16))
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    probe = (
        f"{sys.executable} -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}),"
        " timeout=3); s.sendall(b'hello'); print('connected')\""
    )
    try:
        on = command_runner(probe).run(request(tmp_path, network=True), threading.Event())
        off = command_runner(probe).run(request(tmp_path, network=False), threading.Event())
    finally:
        server.close()
    assert on.ok and on.text.strip() == "connected"
    assert off.error_kind == "exit_code" and "Connection refused" in (off.error or "")
    assert accepted == [b"hello"]  # the sandboxed call never reached it


def process_alive_with(needle: str) -> list[int]:
    """Live processes (not zombies) whose command line holds ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def tree_command(tag: str) -> str:
    # A child, a grandchild that left the session (setsid) and ignores SIGTERM.
    return f"sleep 300.{tag}1 & setsid sh -c 'trap \"\" TERM; sleep 300.{tag}2' & sleep 300.{tag}3"


def wait_for(predicate, timeout_s: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_timeout_kills_a_sandboxed_agents_whole_tree(tmp_path: Path) -> None:
    tag = "4711"
    runner = command_runner(tree_command(tag))
    result = runner.run(request(tmp_path, timeout_s=1.5), threading.Event())
    assert result.error_kind == "timeout"
    assert process_alive_with(f"300.{tag}") == []


def test_a_cancellation_kills_a_sandboxed_agents_whole_tree(tmp_path: Path) -> None:
    tag = "4712"
    cancel = threading.Event()
    started = []
    runner = command_runner(tree_command(tag))
    watcher = threading.Timer(1.0, lambda: (started.extend(process_alive_with(tag)), cancel.set()))
    watcher.start()
    result = runner.run(request(tmp_path, timeout_s=60), cancel)
    assert len(started) >= 3  # the tree was there when cancelled
    assert result.error_kind == "interrupted"
    assert process_alive_with(f"300.{tag}") == []


KILLED_PHASEGATE = """
import sys
from pathlib import Path
from phasegate.proc.process import kill_orphan_group, run_supervised, start_ticks
from phasegate.proc.sandbox import agent_confinement
cwd = Path(sys.argv[1])
c = agent_confinement("bwrap", network=True, cwd=cwd, state_dir=None, repo=cwd.parent)
run_supervised(sys.argv[2], cwd=cwd, env=None, stdin=None, timeout_s=300, cancel=None,
               on_spawn=lambda pid: print(pid, flush=True), confinement=c)
"""


def test_a_killed_phasegate_takes_its_sandboxed_agents_tree_with_it(tmp_path: Path) -> None:
    tag = "4713"
    (tmp_path / "wt").mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_PHASEGATE, str(tmp_path / "wt"), tree_command(tag)],
        stdout=subprocess.PIPE,
        text=True,
    ) as phasegate:
        assert phasegate.stdout is not None
        phasegate.stdout.readline()  # the supervisor started
        assert wait_for(lambda: len(process_alive_with(f"300.{tag}")) >= 3)
        phasegate.send_signal(signal.SIGKILL)
    assert wait_for(lambda: process_alive_with(f"300.{tag}") == [], timeout_s=10)


def test_kill_orphan_group_stops_a_sandboxed_tree_its_dead_worker_left(tmp_path: Path) -> None:
    # The worker died and its supervisor cannot act (stopped): a restarted worker's
    # kill_orphan_group, from the journaled pid and start ticks, stops the tree.
    tag = "4715"
    (tmp_path / "wt").mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_PHASEGATE, str(tmp_path / "wt"), tree_command(tag)],
        stdout=subprocess.PIPE,
        text=True,
    ) as phasegate:
        assert phasegate.stdout is not None
        supervisor = int(phasegate.stdout.readline())
        ticks = start_ticks(supervisor)
        assert wait_for(lambda: len(process_alive_with(f"300.{tag}")) >= 3)
        os.kill(supervisor, signal.SIGSTOP)
        phasegate.send_signal(signal.SIGKILL)
    time.sleep(0.5)
    assert len(process_alive_with(f"300.{tag}")) >= 3  # nothing stopped it yet
    assert kill_orphan_group(supervisor, ticks)
    assert wait_for(lambda: process_alive_with(f"300.{tag}") == [], timeout_s=5)


def test_checks_run_confined_in_their_checkout(tmp_path: Path) -> None:
    checkout = make_repo(tmp_path / "checkout")
    outside = tmp_path / "outside.txt"
    results = run_checks(
        ["echo ok > in-checkout.txt", f"echo no > {outside}", "touch $TMPDIR/scratch"],
        checkout,
        30,
        confinement=check_confinement("bwrap", network=True),
    )
    assert [r.passed for r in results] == [True, False, True]
    assert (checkout / "in-checkout.txt").read_text() == "ok\n"
    assert "Read-only file system" in results[1].output and not outside.exists()


def test_refused_writes_are_named_from_what_real_programs_print(tmp_path: Path) -> None:
    worktree = tmp_path / "wt"
    worktree.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    c = confinement("bwrap", network=True, writable=[worktree])
    script = textwrap.dedent(
        f"""
        touch {target}/by-touch
        echo x > {target}/by-sh
        mkdir {target}/by-mkdir
        {sys.executable} -c "open('{target}/by-python', 'w')"
        git -C {target} init -q
        echo fine > mine.txt
        """
    )
    finished = run_supervised(
        script, cwd=worktree, env=None, stdin=None, timeout_s=30, cancel=None, confinement=c
    )
    found = dict(refused_writes(finished.stdout + finished.stderr, c, worktree))
    assert {f"{target}/{name}" for name in ("by-touch", "by-sh", "by-mkdir", "by-python")} <= set(
        found
    )
    assert any(p.startswith(f"{target}/.git") for p in found), found
    assert (worktree / "mine.txt").read_text() == "fine\n"
    assert not any(p.startswith(str(worktree)) for p in found)
    # A transcript repeats the ticket: a refusal quoted from it is not the agent's.
    quoted = f"touch: cannot touch '{target}/by-touch': Read-only file system"
    assert refused_writes(quoted, c, worktree, prompt=f"The log says:\n{quoted}\n") == []


def test_make_undumpable_turns_off_dumpable_for_phasegates_process() -> None:
    probe = (
        "import ctypes; from phasegate.proc.sandbox import make_undumpable; "
        "assert make_undumpable(); "
        "print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"  # PR_GET_DUMPABLE
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "0", done.stderr
    assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 1  # this process is untouched


def test_a_sigkilled_supervisor_takes_the_whole_sandbox_with_it(tmp_path: Path) -> None:
    # bwrap dies with the SIGKILLed supervisor, and with bwrap's init the PID namespace,
    # so even a process that cleared its environment (no tag to find) and left the
    # session is gone. bwrap's init arms its death signal only after it has started the
    # command: a kill before that (1 in 4 under load in CI) leaves the sandbox running,
    # and run_supervised's sweep of the supervisor's tag kills that init.
    tag = "4714"
    (tmp_path / "wt").mkdir()
    command = f"env -i setsid sh -c 'trap \"\" TERM; sleep 300.{tag}2' & sleep 300.{tag}1"
    supervisors: list[int] = []

    def kill_the_supervisor() -> None:
        assert wait_for(lambda: len(process_alive_with(f"300.{tag}")) >= 2)
        os.kill(supervisors[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_supervisor)
    c = agent_confinement("bwrap", network=True, cwd=tmp_path / "wt", state_dir=None, repo=tmp_path)
    started = time.monotonic()
    killer.start()
    finished = run_supervised(
        command,
        cwd=tmp_path / "wt",
        env=None,
        stdin=None,
        timeout_s=60,
        cancel=None,
        on_spawn=supervisors.append,
        confinement=c,
    )
    killer.join()
    assert finished.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 30
    assert wait_for(lambda: process_alive_with(f"300.{tag}") == [], timeout_s=5)


def test_a_sandboxed_process_has_no_capability_even_when_phasegate_is_root(tmp_path: Path) -> None:
    # As root, bwrap alone leaves every capability: `mount -o remount,rw /` then
    # makes the whole filesystem writable again (found by a fresh-user trial).
    (tmp_path / "wt").mkdir()
    outside = tmp_path / "outside.txt"
    c = agent_confinement("bwrap", network=True, cwd=tmp_path / "wt", state_dir=None, repo=tmp_path)
    script = (
        "grep CapEff /proc/self/status; mount -o remount,rw,bind / || echo remount refused; "
        f"echo escaped > {outside} || echo write refused; "
        # the kernel's settings are the host's: a second trial wrote domainname there
        "echo sandbox > /proc/sys/kernel/domainname || echo sysctl refused"
    )
    finished = run_supervised(
        script, cwd=tmp_path / "wt", env=None, stdin=None, timeout_s=30, cancel=None, confinement=c
    )
    assert "CapEff:\t0000000000000000" in finished.stdout, finished.stdout
    assert "remount refused" in finished.stdout and "write refused" in finished.stdout
    assert "sysctl refused" in finished.stdout
    assert not outside.exists()
    assert Path("/proc/sys/kernel/domainname").read_text() != "sandbox\n"


# -- the real agent CLIs ------------------------------------------------------------------


def real_cli_project(tmp_path: Path, cli: str, url: str) -> tuple[Path, Callable[[Path], Any]]:
    """A project whose every role is the real ``cli``, and how to run its ticket."""
    roles = ("plan", "plan_review", "build", "review", "verification")
    if cli == "mini":
        bindings = {r: mswe.mini_role(agent_cli(cli), url, key=r != "verification") for r in roles}
        return mswe.make_project(tmp_path, bindings), mswe.TICKET_ENV
    role = real.claude_role if cli == "claude" else real.codex_role
    return real.make_project(
        tmp_path, {r: role(agent_cli(cli), url) for r in roles}
    ), real.TICKET_ENV


def escape_scripts(cli: str, outside: Path) -> dict[str, list[Step]]:
    """Every role answers; the build first tries a write beside the repository."""
    escape = f"echo out > {outside}"
    if cli == "mini":
        bash = mswe.bash
        build = [
            Step(text="Trying.", tools=(bash(f"{escape}; echo the feature > feature.txt"),)),
            mswe.answer("Created feature.txt."),
        ]
        return mswe.mini_scripts(build=build)
    if cli == "claude":
        write = ToolCall("Write", {"file_path": "{cwd}/feature.txt", "content": "the feature\n"})
        build = [
            Step(tools=(ToolCall("Bash", {"command": escape}),)),
            Step(tools=(write,)),
            Step(text="Created feature.txt."),
        ]
    else:
        both = ToolCall("exec_command", {"cmd": f"{escape}; echo the feature > feature.txt"})
        build = [Step(tools=(both,)), Step(text="Created feature.txt.")]
    scripts = real.claude_scripts(build=build)
    scripts[real.VERIFY] = [Step(text="It is there.\nVERDICT: confirmed")]
    return scripts


@pytest.mark.slow
@pytest.mark.parametrize("cli", ["claude", "codex", "mini"])
def test_a_real_cli_agents_refused_write_is_a_named_violation(
    tmp_path: Path, cli: str, server_factory
) -> None:
    outside = tmp_path / "outside.txt"
    server = server_factory(escape_scripts(cli, outside))
    repo, ticket_env = real_cli_project(tmp_path, cli, server.url)
    proc = agent_cli_kit.run_ticket(repo, ticket_env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # The refused write holds the merge for a person, whatever the profile.
    assert summary["status"] == "waiting", summary
    approve = phasegate_cli(
        "approve-merge", summary["id"], "--repo", str(repo), "--json", env=dict(ticket_env)
    )
    assert json.loads(approve.stdout)["status"] == "completed", approve.stdout + approve.stderr
    assert git(repo, "show", "main:feature.txt") == "the feature"
    assert not outside.exists()
    violations = real.show(repo, summary["id"])["violations"]
    denied = [(v["name"], v["role"], v["paths"]) for v in violations]
    # Exactly the one refused write: the CLI's own work in the sandbox refuses nothing.
    assert denied == [("sandbox_denied", "build", [str(outside)])]


#: A build agent that waits, while it runs, for the test to say the person is done.
WAIT_FOR_PERSON = r"""
import os, sys, time
go = sys.argv[2]
open("feature.txt", "w").write("the feature\n")
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.05)
print("built")
"""


def test_a_person_working_in_the_repository_during_a_confined_run_keeps_their_work(
    tmp_path: Path,
) -> None:
    # A confined agent cannot move refs or write git's config: the guard watches what
    # it can reach only, so a person's commit, branch, config, hook and info/ edits
    # made while it runs are theirs to keep (found by a fresh-user trial; an
    # unconfined run undoes them: tests/test_guards.py).
    env = phasegate_env(tmp_path)
    gitconfig = Path(env["HOME"]) / ".gitconfig"
    gitconfig.write_text("[user]\n\tname = Person\n\temail = person@example.com\n")
    go = tmp_path / "go"
    agent = tmp_path / "wait.py"
    agent.write_text(WAIT_FOR_PERSON)
    command = f"{sys.executable} {agent} unused {go}"
    build = f'runner = "command"\ncommand = {toml_string(command)}\nsandbox = "bwrap"\n'
    repo = project(tmp_path, build)
    exe = Path(sys.executable).parent / "phasegate"
    worker = subprocess.Popen(
        [exe, "run", "--repo", repo, "--json", "add the feature"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        worktrees = repo / ".phasegate" / "worktrees"
        deadline = time.monotonic() + 60
        while not any((w / "feature.txt").exists() for w in worktrees.glob("*")):
            assert time.monotonic() < deadline and worker.poll() is None, worker.stderr
            time.sleep(0.05)
        person = {**env, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00", "HOME": env["HOME"]}
        (repo / "mine.txt").write_text("the person's own work\n")
        for args in (["add", "mine.txt"], ["commit", "-qm", "my work"], ["branch", "mine"]):
            subprocess.run(["git", *args], cwd=repo, env=person, check=True)
        mine = git(repo, "rev-parse", "HEAD")
        gitconfig.write_text(gitconfig.read_text() + "[alias]\n\tst = status\n")
        subprocess.run(
            ["git", "config", "user.signingkey", "mine"], cwd=repo, env=person, check=True
        )
        hook = repo / ".git" / "hooks" / "pre-push"
        hook.write_text("#!/bin/sh\nexit 0\n")
        with (repo / ".git" / "info" / "exclude").open("a") as exclude:
            exclude.write("my-scratch/\n")
        go.touch()
        out, err = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err
    summary = json.loads(out)
    assert summary["status"] == "completed", summary
    assert git(repo, "rev-parse", "mine") == mine  # the person's branch stays
    assert git(repo, "merge-base", "--is-ancestor", mine, "main") == ""  # their commit too
    assert git(repo, "show", "main:mine.txt") == "the person's own work"
    assert git(repo, "show", "main:feature.txt") == "the feature"
    assert "st = status" in gitconfig.read_text()
    assert git(repo, "config", "user.signingkey") == "mine"
    assert hook.read_text() == "#!/bin/sh\nexit 0\n"
    assert "my-scratch/" in (repo / ".git" / "info" / "exclude").read_text()
    detail = json.loads(phasegate_cli("show", summary["id"], "--repo", str(repo), "--json").stdout)
    assert detail["violations"] == []
