"""How the graph asks agents: it yields an AgentCall and is sent an Answer.

The graph is a generator (``Graph``); whoever drives it does the I/O. The
shell answers through the AgentService; tests and replay answer from data
with the two answer sources shipped here, so the graph is tested and replayed
without a process or a mock::

    record = drive(lifecycle_propose(...), ScriptedAnswers({"plan": [...]}))

Every call the graph made is in the run record's ``calls``, in order, with
its role, thread, prompt hash, response, tokens, cost and seconds;
``RecordedAnswers`` answers a replay from exactly those rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from phasegate.core.contract import PhasegateError

__all__ = [
    "AgentCall",
    "Answer",
    "AnswerSource",
    "Graph",
    "GraphError",
    "RecordedAnswers",
    "ReplayDivergence",
    "ScriptedAnswers",
    "asked_as",
    "call_row",
    "drive",
    "prompt_hash",
    "recorded_answer",
]

T = TypeVar("T")


class GraphError(PhasegateError):
    """The graph was driven or configured wrongly (not an agent's failure)."""


class ReplayDivergence(GraphError):
    """A replayed run asked something other than what the record holds."""


@dataclass(frozen=True)
class AgentCall:
    """One question of the graph: ``role`` (a cartridge role) on ``thread``.

    ``thread`` names the conversation the answer belongs to (plan,
    plan_alternative, plan_arbitrate, plan_adversary, build, review,
    adversary, arbitrate, scope); ``node`` is the graph node that asks.
    """

    node: str
    role: str
    thread: str
    prompt: str


@dataclass(frozen=True)
class Answer:
    """What the shell sends back for an AgentCall.

    ``error_kind`` is None for an answer, or one of ``phasegate.agents.ERROR_KINDS``
    (``budget``: a spend cap stopped the call) when the role failed every try.
    Tokens are counts, ``cost_usd`` is USD, ``duration_s`` seconds as the shell
    measured them (the graph has no clock).
    """

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    error_kind: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


#: Anything that answers a call: the shell, ScriptedAnswers, RecordedAnswers.
AnswerSource = Callable[[AgentCall], Answer]

#: A graph: yields calls, is sent answers, returns its value.
Graph = Generator[AgentCall, Answer, T]


def prompt_hash(prompt: str) -> str:
    """The SHA-256 of the prompt's UTF-8 bytes, in hex."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def drive(graph: Generator[AgentCall, Answer, T], answers: AnswerSource) -> T:
    """Run ``graph`` to its end, answering every call from ``answers``."""
    try:
        call = next(graph)
        while True:
            call = graph.send(answers(call))
    except StopIteration as done:
        value: T = done.value  # what the generator returned, of its declared type
        return value


def call_row(index: int, call: AgentCall, answer: Answer) -> dict[str, Any]:
    """The record of one call, as the run record keeps it."""
    return {
        "index": index,
        "node": call.node,
        "role": call.role,
        "thread": call.thread,
        "prompt_sha256": prompt_hash(call.prompt),
        "response": answer.text,
        "input_tokens": answer.input_tokens,
        "output_tokens": answer.output_tokens,
        "cost_usd": answer.cost_usd,
        "duration_s": answer.duration_s,
        "error_kind": answer.error_kind,
        "error": answer.error,
    }


class ScriptedAnswers:
    """Answers per role, in order: ``answers[role][i]`` for the role's i-th call.

    An entry is a text or an Answer; the last one repeats. A role with no
    answers fails like an unbound runner (``runner_error``). ``calls`` keeps
    every call received, for tests to read prompts and threads.
    """

    def __init__(self, answers: Mapping[str, Sequence[str | Answer]]) -> None:
        self.answers = answers
        self.calls: list[AgentCall] = []

    def __call__(self, call: AgentCall) -> Answer:
        made = sum(1 for c in self.calls if c.role == call.role)
        self.calls.append(call)
        script = self.answers.get(call.role)
        if not script:
            return Answer(
                "", error_kind="runner_error", error=f"no scripted answers for role {call.role!r}"
            )
        entry = script[min(made, len(script) - 1)]
        return entry if isinstance(entry, Answer) else Answer(entry)

    def of(self, role: str) -> list[AgentCall]:
        """The calls ``role`` received, in order."""
        return [c for c in self.calls if c.role == role]


class RecordedAnswers:
    """Answers a replay from a run record's ``calls`` rows, in order.

    The i-th call must match the i-th row's node, role, thread and prompt
    hash; anything else raises ReplayDivergence, as does a call past the end.
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self.rows = list(rows)
        self.next = 0

    def __call__(self, call: AgentCall) -> Answer:
        if self.next >= len(self.rows):
            raise ReplayDivergence(
                f"call {self.next} ({call.role} on {call.thread}) is past the recorded run's "
                f"{len(self.rows)} call(s)"
            )
        row = self.rows[self.next]
        if not asked_as(call, row):
            recorded = (row["node"], row["role"], row["thread"])
            raise ReplayDivergence(
                f"call {self.next}: the replay asked {(call.node, call.role, call.thread)} "
                f"(prompt {prompt_hash(call.prompt)[:12]}), the record holds {recorded} "
                f"(prompt {str(row['prompt_sha256'])[:12]})"
            )
        self.next += 1
        return recorded_answer(row)


def asked_as(call: AgentCall, row: Mapping[str, Any]) -> bool:
    """Whether ``call`` is the call ``row`` records: node, role, thread and prompt hash."""
    asked = (call.node, call.role, call.thread, prompt_hash(call.prompt))
    return asked == (row["node"], row["role"], row["thread"], row["prompt_sha256"])


def recorded_answer(row: Mapping[str, Any]) -> Answer:
    """The Answer a ``call_row`` holds."""
    return Answer(
        str(row["response"]),
        input_tokens=int(row["input_tokens"]),
        output_tokens=int(row["output_tokens"]),
        cost_usd=float(row["cost_usd"]),
        duration_s=float(row["duration_s"]),
        error_kind=row["error_kind"],
        error=row["error"],
    )
