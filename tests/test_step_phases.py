"""One step path: ``Engine.step``, a multi-step window and a fast-forward span drive the engine
through its public step phases (schedule, execute, price, apply, record), and the engine's one
apply is, besides the allocator, the only writer of ``seq.num_computed_tokens``."""

from __future__ import annotations

import ast
from pathlib import Path

from servelab.core.request import Request

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("framework", "plugins")

#: the writers allowed: the engine's apply (a step computed tokens; a verification rolled drafts
#: back; a fast-forward span's quiet steps) and the allocator's three methods for KV that appears or
#: goes without being computed here
WRITERS = {
    ("framework/engine/engine.py", "Engine.apply"),
    ("framework/core/interfaces.py", "BlockAllocator.start_sequence"),
    ("framework/core/interfaces.py", "BlockAllocator.mark_loaded"),
    ("framework/core/interfaces.py", "BlockAllocator.reset"),
}
#: objects with a field of the same name that is not a sequence's: a PreemptionDecision records the
#: victim's KV at preemption (the scheduler sets it)
NOT_SEQUENCES = {"decision"}


def _writes(tree: ast.AST, attribute: str) -> list[tuple[str, int]]:
    """(enclosing ``Class.function``, line) of each assignment to ``<x>.<attribute>`` and each
    ``setattr(x, "<attribute>", ...)`` in ``tree``, but those on :data:`NOT_SEQUENCES`."""
    found: list[tuple[str, int]] = []

    def targets(node: ast.AST) -> list[ast.expr]:
        if isinstance(node, ast.Assign):
            return [t for target in node.targets for t in _flatten(target)]
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            return _flatten(node.target)
        return []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope + [child.name] if isinstance(child, (ast.ClassDef, ast.FunctionDef,
                                                                 ast.AsyncFunctionDef)) else scope
            for target in targets(child):
                if isinstance(target, ast.Attribute) and target.attr == attribute and not (
                        isinstance(target.value, ast.Name) and target.value.id in NOT_SEQUENCES):
                    found.append((".".join(scope), child.lineno))
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "setattr"
                    and len(child.args) > 1 and isinstance(child.args[1], ast.Constant)
                    and child.args[1].value == attribute):
                found.append((".".join(scope), child.lineno))
            visit(child, inner)

    visit(tree, [])
    return found


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flatten(element)]
    if isinstance(target, ast.Starred):
        return _flatten(target.value)
    return [target]


def test_only_the_allocator_and_the_engines_apply_write_num_computed_tokens():
    writers = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for where, line in _writes(ast.parse(path.read_text(), rel), "num_computed_tokens"):
                writers.setdefault((rel, where), []).append(line)
    assert set(writers) <= WRITERS, {k: v for k, v in writers.items() if k not in WRITERS}
    assert ("framework/engine/engine.py", "Engine.apply") in writers  # the scan sees the writer it allows


def test_the_scan_finds_every_form_of_write():
    source = ("class A:\n def f(self, seq, d):\n  seq.num_computed_tokens += 1\n"
              "  x = seq.num_computed_tokens = 2\n  a, seq.num_computed_tokens = 1, 2\n"
              "  setattr(seq, 'num_computed_tokens', 3)\n  decision.num_computed_tokens = 4\n"
              "  seq.num_computed_tokens == 5\n")
    assert _writes(ast.parse(source), "num_computed_tokens") == [("A.f", 3), ("A.f", 4), ("A.f", 5), ("A.f", 6)]


def test_multi_step_and_fast_forward_use_only_the_engines_public_phases():
    for rel in ("framework/engine/multi_step.py", "framework/engine/fast_forward.py"):
        tree = ast.parse((ROOT / rel).read_text(), rel)
        private = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                          and isinstance(n.value, ast.Name) and n.value.id == "engine" and n.attr.startswith("_")})
        assert not private, (rel, private)


def test_step_is_its_phases_composed(fake_stack):
    """Driving the phases by hand gives the tokens, times, preemptions and totals ``step()`` gives
    (a pool small enough to preempt, chunked prompts)."""
    from servelab.engine.batch import step_work

    def run(by_hand: bool):
        stack, _ = fake_stack("max_num_batched_tokens=32", "max_num_seqs=8", "block_size=4", num_kv_blocks=24)
        engine = stack.engine
        for i in range(6):
            engine.add_request(Request(f"r{i}", tuple(range(1, 10 + 7 * i)), 6 + 3 * i))
        records = []
        while engine.has_unfinished():
            if not by_hand:
                records.append(engine.step())
                continue
            start = engine.now()
            plan = engine.schedule(start)
            work = step_work(plan)
            output = engine.execute(plan, work)
            end = engine.price(work)
            engine.apply(plan, output, end)
            records.append(engine.record(plan, work, start, end, output))
        seqs = sorted(engine.sequences.values(), key=lambda s: s.id)
        return ([(s.id, list(s.output_token_ids), s.token_times, s.finish_reason) for s in seqs],
                [(r.step, r.num_tokens, r.time_s, len(r.preempted)) for r in records], engine.totals)

    by_hand, stepped = run(True), run(False)
    assert stepped[2].num_preemptions > 0  # the case preempts
    assert by_hand == stepped
