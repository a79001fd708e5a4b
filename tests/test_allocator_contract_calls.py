"""No code outside an allocator uses allocator members that are not in the ``BlockAllocator``
contract (issue 44): the tiers, the scheduler, the engine, the cluster and the kits go through the
contract's methods and attributes, so any allocator plugin serves them. An import-linter contract
cannot see methods; this walks the syntax trees of ``framework/`` and ``plugins/`` (allocators
themselves excepted) for attribute uses on anything named ``allocator``."""

from __future__ import annotations

import ast
from pathlib import Path

from servelab.core.interfaces import BlockAllocator

ROOT = Path(__file__).resolve().parents[1]
# set in BlockAllocator.__init__ / Plugin.__init__ (instance attributes of every allocator)
INSTANCE = {"config", "context", "num_blocks", "block_size", "limits", "num_swap_blocks", "evictor",
            "block_subscribers"}
# The evictor kit drives a paged allocator on purpose and checks each victim against its books.
EXEMPT = {"framework/kit/conformance_evictor.py"}


def _is_allocator(node: ast.expr) -> bool:
    """``allocator`` or ``<x>.allocator``, but not a config node (``cfg.allocator.name``)."""
    if isinstance(node, ast.Name):
        return node.id == "allocator"
    return isinstance(node, ast.Attribute) and node.attr == "allocator" and \
        not (isinstance(node.value, ast.Name) and node.value.id in ("cfg", "config"))


def _uses(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and _is_allocator(node.value):
            yield node.attr, node.lineno


def test_nothing_outside_an_allocator_uses_members_outside_the_contract():
    allowed = set(dir(BlockAllocator)) | INSTANCE
    files = [p for folder in ("framework", "plugins") for p in (ROOT / folder).rglob("*.py")
             if "allocators" not in p.relative_to(ROOT).parts and str(p.relative_to(ROOT)) not in EXEMPT]
    assert len(files) > 50
    outside = sorted(f"{p.relative_to(ROOT)}:{line}: allocator.{attr}" for p in files for attr, line in _uses(p)
                     if attr not in allowed)
    assert not outside, "not in BlockAllocator:\n" + "\n".join(outside)
