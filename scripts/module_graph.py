#!/usr/bin/env python3
"""Module graph of the ``servelab`` package, read from the source (AST; nothing is imported).

    python scripts/module_graph.py [ROOT]

ROOT is the folder that is the ``servelab`` package (default: this repository's ``framework/``).
Packages that ``pyproject.toml`` (next to ROOT) maps from elsewhere (``servelab.plugins`` ->
``plugins/``, ``servelab.kernels`` -> ``kernels/``) are read too. Works on the old flat layout and
on the layered one, so two commits can be compared (``git worktree add /tmp/base HEAD``).

Prints lines of code and modules per package, the import edges between servelab modules (and
between packages), every function-local import with file:line, and import cycles: strongly
connected components of more than one module, over the imports that run (module-level and
function-local); imports only under ``if TYPE_CHECKING:`` are counted apart.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

TOP = "servelab"


@dataclass(frozen=True)
class Imp:
    importer: str      # module name
    target: str        # imported module (resolved to a module that exists when it is servelab's)
    path: Path
    line: int
    kind: str          # "module" | "function" | "type_checking"
    aliased: bool = False  # resolved through the old-path aliases (servelab._moved)


def package_roots(root: Path) -> dict[str, Path]:
    """{package name: folder}: ROOT as servelab, plus the mapped packages outside it."""
    roots = {TOP: root}
    pyproject = root.parent / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib  # noqa: PLC0415 - Python 3.11+; on 3.10 the mapping is skipped
            mapping = tomllib.loads(pyproject.read_text())["tool"]["setuptools"].get("package-dir", {})
        except (ImportError, KeyError, ValueError):
            mapping = {}
        for name, rel in sorted(mapping.items()):
            folder = (root.parent / rel).resolve()
            if not name.startswith(TOP + ".") or not folder.is_dir():
                continue
            inside = [f for f in roots.values() if folder == f.resolve() or f.resolve() in folder.parents]
            if not inside:
                roots[name] = folder
    return roots


def discover(roots: dict[str, Path]) -> dict[str, Path]:
    """{module name: file}; a package is named by its __init__.py."""
    modules: dict[str, Path] = {}
    for pkg, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = list(rel.parts)
            if any(p.startswith(".") or p == "__pycache__" or not p.isidentifier() for p in parts):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([pkg, *parts])] = path
    return modules


def moved_aliases(modules: dict[str, Path]) -> dict[str, str]:
    """servelab._moved's MOVED table ({old: new}, full names), read as a literal."""
    path = modules.get(f"{TOP}._moved")
    if path is None:
        return {}
    for node in ast.walk(ast.parse(path.read_text())):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "MOVED" and node.value is not None:
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {f"{TOP}.{old}": f"{TOP}.{new}" for old, new in table.items()}
    return {}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class Collector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[ast.AST, str]] = []  # (Import/ImportFrom node, kind)
        self._function = 0
        self._type_checking = 0

    def _kind(self) -> str:
        if self._type_checking:
            return "type_checking"
        return "function" if self._function else "module"

    def visit_FunctionDef(self, node):
        for d in node.decorator_list:
            self.visit(d)
        self._function += 1
        for stmt in node.body:
            self.visit(stmt)
        self._function -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node):
        if is_type_checking(node.test):
            self._type_checking += 1
            for stmt in node.body:
                self.visit(stmt)
            self._type_checking -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def visit_Import(self, node):
        self.found.append((node, self._kind()))

    visit_ImportFrom = visit_Import


def resolve(name: str, modules: dict[str, Path], aliases: dict[str, str]) -> tuple[str, bool] | None:
    """The longest existing servelab module that ``name`` names (through old-path aliases)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in aliases:
            hit = resolve(".".join([aliases[head], *parts[i:]]), modules, {})
            return (hit[0], True) if hit else None
        if head in modules:
            return head, False
    return None


def collect(modules: dict[str, Path]) -> tuple[list[Imp], list[Imp]]:
    """(servelab imports, every function-local import whatever it imports)."""
    aliases = moved_aliases(modules)
    internal: list[Imp] = []
    local: list[Imp] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        c = Collector()
        c.visit(tree)
        is_pkg = path.name == "__init__.py"
        for node, kind in c.found:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".")
                    anchor = anchor if is_pkg else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import sub` imports the module pkg.sub when there is one
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules or f"{base}.{a.name}" in aliases
                         else base for a in node.names]
            for name in dict.fromkeys(names):
                if kind == "function":
                    local.append(Imp(mod, name, path, node.lineno, kind))
                if name != TOP and not name.startswith(TOP + "."):
                    continue
                hit = resolve(name, modules, aliases)
                if hit is None or hit[0] == mod:
                    continue
                internal.append(Imp(mod, hit[0], path, node.lineno, kind, hit[1]))
    return internal, local


def package_of(mod: str, modules: dict[str, Path]) -> str:
    return mod if modules[mod].name == "__init__.py" else mod.rpartition(".")[0]


def sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), those of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def runtime_cycles(root: Path) -> list[list[str]]:
    """The import cycles of the package at ``root`` over the imports that run: module-level and
    function-local (a function-local import hides a cycle from import time, not from the design);
    imports only under ``if TYPE_CHECKING:`` do not count. Each cycle is its modules, sorted."""
    modules = discover(package_roots(root))
    internal, _ = collect(modules)
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in internal:
        if imp.kind != "type_checking":
            edges[imp.importer].add(imp.target)
    return sccs(sorted(modules), edges)


def loc(path: Path) -> tuple[int, int]:
    lines = path.read_text().splitlines()
    code = sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#"))
    return len(lines), code


def report(root: Path, show_edges: bool = True) -> None:
    roots = package_roots(root)
    modules = discover(roots)
    internal, local = collect(modules)
    base = root.resolve().parent

    def where(imp: Imp) -> str:
        p = imp.path.resolve()
        return f"{p.relative_to(base) if base in p.parents else p}:{imp.line}"

    print(f"servelab module graph of {root.resolve()}  (packages: "
          + ", ".join(f"{k} -> {v.resolve().relative_to(base) if base in v.resolve().parents else v}"
                      for k, v in roots.items()) + ")")

    # -- size ---------------------------------------------------------------------------------------
    per_pkg: dict[str, list[str]] = defaultdict(list)
    for mod in modules:
        per_pkg[package_of(mod, modules)].append(mod)
    print("\n== lines of code and modules per package (lines = all, code = not blank, not a comment)")
    print(f"{'package':32} {'modules':>7} {'lines':>7} {'code':>7}")
    tot = [0, 0, 0]
    for pkg in sorted(per_pkg):
        sizes = [loc(modules[m]) for m in per_pkg[pkg]]
        row = [len(sizes), sum(s[0] for s in sizes), sum(s[1] for s in sizes)]
        tot = [a + b for a, b in zip(tot, row)]
        print(f"{pkg:32} {row[0]:>7} {row[1]:>7} {row[2]:>7}")
    print(f"{'total':32} {tot[0]:>7} {tot[1]:>7} {tot[2]:>7}")

    # -- edges --------------------------------------------------------------------------------------
    by_kind: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for imp in internal:
        by_kind[imp.kind].add((imp.importer, imp.target))
    runtime = by_kind["module"] | by_kind["function"]
    tc_only = by_kind["type_checking"] - runtime
    fn_only = by_kind["function"] - by_kind["module"]
    aliased = {(i.importer, i.target) for i in internal if i.aliased}
    print("\n== import edges between servelab modules (distinct importer -> imported pairs)")
    print(f"module-level: {len(by_kind['module'])}   function-local only: {len(fn_only)}   "
          f"TYPE_CHECKING only: {len(tc_only)}   all that run: {len(runtime)}   "
          f"via old-path aliases: {len(aliased)}")

    pkg_edges: Counter[tuple[str, str]] = Counter()
    for a, b in runtime:
        pa, pb = package_of(a, modules), package_of(b, modules)
        if pa != pb:
            pkg_edges[(pa, pb)] += 1
    print("\n== package -> package (module edges that run, * = some only function-local)")
    fn_pkg = {(package_of(a, modules), package_of(b, modules)) for a, b in fn_only}
    for (pa, pb), n in sorted(pkg_edges.items()):
        print(f"  {pa:28} -> {pb:28} {n:>4}{' *' if (pa, pb) in fn_pkg else ''}")

    if show_edges:
        print("\n== module edges (M = module-level, F = function-local only, T = TYPE_CHECKING only)")
        for a, b in sorted(runtime | tc_only):
            tag = "M" if (a, b) in by_kind["module"] else "F" if (a, b) in fn_only else "T"
            print(f"  {tag} {a} -> {b}")

    # -- function-local imports ---------------------------------------------------------------------
    print(f"\n== function-local imports: {len(local)} "
          f"({sum(1 for i in local if i.target.startswith(TOP))} of servelab modules)")
    per_mod = Counter(i.importer for i in local)
    for imp in sorted(local, key=lambda i: (str(i.path), i.line)):
        print(f"  {where(imp):48} {imp.target}")
    if per_mod:
        print("  per package: " + ", ".join(
            f"{p} {n}" for p, n in sorted(Counter(package_of(m, modules) for m in
                                                  (i.importer for i in local)).items())))

    # -- cycles ----------------------------------------------------------------------------------------
    def graph(pairs: set[tuple[str, str]]) -> dict[str, set[str]]:
        g: dict[str, set[str]] = defaultdict(set)
        for a, b in pairs:
            g[a].add(b)
        return g

    names = sorted(modules)
    run_cycles = sccs(names, graph(runtime))
    mod_cycles = sccs(names, graph(by_kind["module"]))
    tc_cycles = sccs(names, graph(runtime | tc_only))
    print("\n== import cycles (strongly connected components > 1 module)")
    print(f"over module-level imports: {len(mod_cycles)}   over all that run (+ function-local): "
          f"{len(run_cycles)}   adding TYPE_CHECKING-only imports: {len(tc_cycles)} "
          f"(TYPE_CHECKING-only imports: {len(tc_only)})")
    for label, comps in (("module-level", mod_cycles), ("+ function-local", run_cycles),
                         ("+ TYPE_CHECKING", tc_cycles)):
        for comp in comps:
            print(f"  [{label}] {len(comp)}: {', '.join(comp)}")
    if tc_only:
        print("  TYPE_CHECKING-only imports:")
        for imp in sorted({i for i in internal if (i.importer, i.target) in tc_only},
                          key=lambda i: (str(i.path), i.line)):
            print(f"    {where(imp):46} {imp.target}")


def main(argv: list[str] | None = None) -> int:
    default = Path(__file__).resolve().parent.parent / "framework"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="?", type=Path, default=default,
                    help="the servelab package folder (default: %(default)s)")
    ap.add_argument("--no-edges", action="store_true", help="leave out the list of module edges")
    args = ap.parse_args(argv)
    if not (args.root / "__init__.py").is_file():
        ap.error(f"{args.root} is not a package folder (no __init__.py)")
    report(args.root, show_edges=not args.no_edges)
    return 0


if __name__ == "__main__":
    sys.exit(main())
