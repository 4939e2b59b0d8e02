"""The typed workflow state (core/state.py) against the code that writes and reads it.

The source is scanned for every state key: a read (``ctx.state.get("k")``,
``row["state"]["k"]``, ``"k" in state``, ...) and a write (the keys of a dict
literal given as ``state=`` or assigned to ``state``). A key the scan finds must
be declared in WorkflowState, and its module named in OWNERS as a writer or a
reader. The type checker holds the rest (a dict built elsewhere and typed
WorkflowState); this scan also reaches rows whose state is untyped JSON.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import phasegate
from phasegate.core.state import OWNERS, WorkflowState, state_of

SRC = Path(phasegate.__file__).parent

#: Modules where a local name ``state`` is something else (a process's, a guard's, a
#: forge check's, the graph's run), never the workflow's state.
OTHER_STATES = frozenset(
    {
        "agents/runners/opencode.py",
        "cli/proposals.py",
        "cli/setup.py",
        "forge/github/forge.py",
        "git/guard.py",
        "git/repair.py",
        "graph/lifecycle.py",
        "store/_postgres.py",
    }
)


def _is_state(node: ast.expr, path: str) -> bool:
    """Whether ``node`` is a workflow's state: ``x.state``, ``row["state"]``,
    ``row.get("state")``, ``(x.state or {})``, or a name ``state``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "state"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "state"
    if isinstance(node, ast.Call):
        func, args = node.func, node.args
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and bool(args)
            and isinstance(args[0], ast.Constant)
            and args[0].value == "state"
        )
    if isinstance(node, ast.BoolOp):
        return _is_state(node.values[0], path)
    return isinstance(node, ast.Name) and node.id == "state" and path not in OTHER_STATES


def _uses(path: Path) -> Iterator[tuple[str, str, int, str]]:
    """Each (key, module, line, "read" or "write") in the file at ``path``."""
    rel = path.relative_to(SRC).as_posix()
    module = rel.removesuffix(".py").replace("/", ".")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants: dict[str, str] = {}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            constants.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})

    def key(node: ast.expr | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    def written(literal: ast.Dict) -> Iterator[tuple[str, str, int, str]]:
        for k in literal.keys:
            name = key(k)
            if name is not None:
                yield name, module, literal.lineno, "write"

    for node in ast.walk(tree):
        found: str | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and node.args and _is_state(node.func.value, rel):
                found = key(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_state(node.value, rel):
            name = key(node.slice)
            if name is not None:
                mode = "read" if isinstance(node.ctx, ast.Load) else "write"
                yield name, module, node.lineno, mode
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            if _is_state(node.comparators[0], rel):
                found = key(node.left)
        elif isinstance(node, ast.keyword) and node.arg == "state":
            if isinstance(node.value, ast.Dict):
                yield from written(node.value)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_state(t, rel) for t in targets if isinstance(t, ast.Name)):
                yield from written(node.value)
        if found is not None:
            yield found, module, node.lineno, "read"


def _all_uses() -> list[tuple[str, str, int, str]]:
    return [use for path in sorted(SRC.rglob("*.py")) for use in _uses(path)]


DECLARED = frozenset(WorkflowState.__optional_keys__)


def test_owners_name_every_declared_key_and_only_those() -> None:
    assert WorkflowState.__required_keys__ == frozenset()
    assert set(OWNERS) == DECLARED


def test_owners_name_modules_that_exist() -> None:
    for name, owner in OWNERS.items():
        assert owner.writes, f"{name}: no module writes it"
        for module in (*owner.writes, *owner.reads):
            parts = module.split(".")
            found = SRC.joinpath(*parts).with_suffix(".py").is_file()
            assert found or SRC.joinpath(*parts, "__init__.py").is_file(), (name, module)


def test_the_scan_finds_the_keys_it_should() -> None:
    """The scan is not blind: it finds reads and writes of known keys where they are."""
    uses = {(k, module, mode) for k, module, _line, mode in _all_uses()}
    assert ("plan", "phases.planning", "write") in uses
    assert ("plan", "phases.development", "read") in uses
    assert ("conflict_child", "store.commit", "read") in uses
    assert ("merge_approved", "cli.render", "read") in uses
    assert ("no_progress", "phases.planning", "write") in uses  # through a constant


def test_every_key_in_the_code_is_declared_with_its_writer_and_readers() -> None:
    problems = []
    for name, module, line, mode in _all_uses():
        where = f"{module.replace('.', '/')}.py:{line}"
        if name not in DECLARED:
            problems.append(f"{where}: {mode} of {name!r}, a key core/state.py does not declare")
            continue
        owner = OWNERS[name]
        named = owner.writes if mode == "write" else owner.reads
        if module not in named:
            problems.append(f"{where}: {module} {mode}s {name!r}; OWNERS[{name!r}] misses it")
    assert problems == []


def test_every_declared_key_is_used_somewhere() -> None:
    """No key is declared that no code writes: a dead key goes from core/state.py too."""
    texts = "\n".join(
        p.read_text(encoding="utf-8") for p in SRC.rglob("*.py") if p.name != "state.py"
    )
    assert [k for k in sorted(DECLARED) if f'"{k}"' not in texts] == []


@pytest.mark.parametrize("stored", [None, {}, {"plan": "x", "unknown": 1}])
def test_state_of_copies_the_stored_object_as_it_is(stored: dict[str, object] | None) -> None:
    state = state_of(stored)
    assert state == (stored or {})
    assert state is not stored
