"""Imports point one way: the layer table of docs/architecture.md, checked on every import of the project's own
modules (those inside functions too), plus no import cycle between files. A new module needs a row (or a prefix
that covers it); an arrow that points up or sideways fails here with the file and line."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("token_reduction", "vl", "data_recipes", "eval", "ui", "scripts")


def layer_table() -> list[tuple[int, list[str]]]:
    """[(layer, [module prefix, ...]), ...] from the table under '## Layers'; '|' inside a cell separates siblings."""
    text = (ROOT / "docs/architecture.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|(.*?)\|[^|]*\|\s*$", line.replace("\\|", "\x00"))
        if m:
            rows.append((int(m.group(1)), re.findall(r"`([\w.]+)`", m.group(2))))
    return rows


def classify(table) -> dict[str, tuple[int, str]]:
    """prefix -> (layer, sibling group): modules of one row that the row lists apart with '|' are siblings."""
    text = (ROOT / "docs/architecture.md").read_text()
    out = {}
    for layer, prefixes in table:
        row = next(l for l in text.splitlines() if re.match(rf"\|\s*{layer}\s*\|", l))
        cell = row.split("|")[2] if "\\|" not in row else row.replace("\\|", "\x00").split("|")[2]
        groups = cell.split("\x00")
        for prefix in prefixes:
            group = next(i for i, g in enumerate(groups) if f"`{prefix}`" in g)
            out[prefix] = (layer, f"{layer}.{group}")
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    files = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            files[module_name(path)] = path
    return files


def imports(path: Path, name: str, modules: dict[str, Path]):
    """(target module, line, at module top?) for every import of a project module in the file."""
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # `from pkg import sub` imports the submodule when there is one
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
        for t in targets:
            if t.split(".")[0] in PACKAGES:
                yield t, node.lineno, id(node) in top_level


def owner(module: str, table: dict[str, tuple[int, str]]):
    best = max((p for p in table if module == p or module.startswith(p + ".")), key=len, default=None)
    return best and table[best]


def test_every_module_has_a_layer():
    table = classify(layer_table())
    missing = sorted(m for m in project_files() if owner(m, table) is None)
    assert not missing, f"modules with no row in docs/architecture.md's layer table: {missing}"


def test_imports_point_down_the_layer_table():
    table = classify(layer_table())
    modules = project_files()
    bad = []
    for name, path in sorted(modules.items()):
        src = owner(name, table)
        for target, line, _ in imports(path, name, modules):
            dst = owner(target, table)
            if dst is None or src is None:
                continue
            rel = path.relative_to(ROOT)
            if dst[0] > src[0]:
                bad.append(f"{rel}:{line} imports {target} (layer {dst[0]}) from layer {src[0]}: points up")
            elif dst[0] == src[0] and dst[1] != src[1]:
                bad.append(f"{rel}:{line} imports {target}: siblings of layer {src[0]} never import each other")
    assert not bad, "imports against docs/architecture.md's layers:\n" + "\n".join(dict.fromkeys(bad))


def test_no_import_cycles_between_files():
    modules = project_files()
    graph = defaultdict(set)
    for name, path in modules.items():
        for target, _, _ in imports(path, name, modules):
            # a package import runs its __init__ only: cycles are between files
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                graph[name].add(target)
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    assert not cycles, f"files that import each other (directly or around a loop): {cycles}"


def test_only_the_cli_dispatcher_reaches_the_tools_above_the_library():
    """Inside `vl`, only vl/cli.py may import `ui`, `eval` or `data_recipes` (it dispatches to them and supplies
    their defaults, e.g. the synthetic calibration data of `vl quantize` and `vl bench`)."""
    modules = project_files()
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in sorted(modules.items()) if name.split(".")[0] == "vl" and name != "vl.cli"
           for target, line, _ in imports(path, name, modules) if target.split(".")[0] in ("ui", "eval", "data_recipes")]
    assert not bad, "\n".join(bad)
