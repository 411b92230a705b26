"""Imports point one way: the layer table of docs/architecture.md, checked on every import of the project's own
modules (those inside functions too), plus no import cycle between files; and the same by folder: one folder holds
one layer, no folder imports a folder above it, no folder cycles. A new module needs a row (or a prefix that covers
it); an arrow that points up or sideways fails here with the file and line."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("token_reduction", "vl", "data_recipes", "eval", "ui", "scripts")


def layer_table(doc: str | None = None) -> list[tuple[int, list[str]]]:
    """[(layer, [module prefix, ...]), ...] from the table under '## Layers'; '|' inside a cell separates siblings."""
    doc = (ROOT / "docs/architecture.md").read_text() if doc is None else doc
    text = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|(.*?)\|[^|]*\|\s*$", line.replace("\\|", "\x00"))
        if m:
            rows.append((int(m.group(1)), re.findall(r"`([\w.]+)`", m.group(2))))
    return rows


def classify(table, doc: str | None = None) -> dict[str, tuple[int, str]]:
    """prefix -> (layer, sibling group): modules of one row that the row lists apart with '|' are siblings."""
    text = (ROOT / "docs/architecture.md").read_text() if doc is None else doc
    out = {}
    for layer, prefixes in table:
        row = next(l for l in text.splitlines() if re.match(rf"\|\s*{layer}\s*\|", l))
        cell = row.split("|")[2] if "\\|" not in row else row.replace("\\|", "\x00").split("|")[2]
        groups = cell.split("\x00")
        for prefix in prefixes:
            group = next(i for i, g in enumerate(groups) if f"`{prefix}`" in g)
            out[prefix] = (layer, f"{layer}.{group}")
    return out


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files(root: Path = ROOT) -> dict[str, Path]:
    files = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            files[module_name(path, root)] = path
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
            if dst is None or src is None or (name == DISPATCHER and target.split(".")[0] in TOOLS):
                continue
            rel = path.relative_to(ROOT)
            if dst[0] > src[0]:
                bad.append(f"{rel}:{line} imports {target} (layer {dst[0]}) from layer {src[0]}: points up")
            elif dst[0] == src[0] and dst[1] != src[1]:
                bad.append(f"{rel}:{line} imports {target}: siblings of layer {src[0]} never import each other")
    assert not bad, "imports against docs/architecture.md's layers:\n" + "\n".join(dict.fromkeys(bad))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops of a directed graph: its strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


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
    cycles = strongly_connected(graph)
    assert not cycles, f"files that import each other (directly or around a loop): {cycles}"


def test_only_the_cli_dispatcher_reaches_the_tools_above_the_library():
    """Inside `vl`, only the dispatcher vl/cli/__init__.py may import `ui`, `eval` or `data_recipes` (it dispatches to
    them and supplies their defaults, e.g. the synthetic calibration data of `vl quantize` and `vl bench`)."""
    modules = project_files()
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in sorted(modules.items()) if name.split(".")[0] == "vl" and name != DISPATCHER
           for target, line, _ in imports(path, name, modules) if target.split(".")[0] in TOOLS]
    assert not bad, "\n".join(bad)


# --- folders ----------------------------------------------------------------------------------------------------
# The same rules by folder (docs/architecture.md, "Layers"): a folder holds one layer, imports only folders below
# it (or beside it in its own cell), and no folders import each other around a loop. The only arrows exempt are the
# `vl` command's dispatch into the tools above the library (the last test keeps them to that one file).
DISPATCHER, TOOLS = "vl.cli", ("ui", "eval", "data_recipes")

def folder_of(name: str, path: Path, root: Path = ROOT) -> str:
    """A module's folder: one level below vl/ (vl/runtime/cpu/ counts with vl/runtime/), the top package for the
    other packages; vl/__init__.py, the facade, is a box of its own, apart from the loose modules of vl/."""
    parts = path.relative_to(root).parts
    if parts[0] != "vl":
        return f"{parts[0]}/"
    if name == "vl":
        return "vl/__init__.py"
    return "vl/" if len(parts) == 2 else f"vl/{parts[1]}/"


def folder_problems(folders: dict[str, str], layers: dict[str, tuple[int, str]],
                    edges: list[tuple[str, str, str]]) -> dict[str, str]:
    """{key: message} for every folder that spans layers, imports a folder above or beside it, or sits on a loop.
    `folders`: module -> folder; `layers`: module -> (layer, sibling group); `edges`: (module, imported module,
    where). A folder's layer is that of its lowest module (its own row in a table by folder)."""
    members = defaultdict(set)
    for module, folder in folders.items():
        if module in layers:
            members[folder].add(module)
    home = {folder: min(layers[m] for m in mods) for folder, mods in members.items()}
    out = {}
    for folder, mods in sorted(members.items()):
        spread = sorted({layers[m][0] for m in mods})
        if len(spread) > 1:
            detail = ", ".join(f"{m} ({layers[m][0]})" for m in sorted(mods) if layers[m][0] != home[folder][0])
            out[f"spans: {folder}"] = f"{folder} holds layers {spread}: {detail}"
    graph = defaultdict(set)
    for src, dst, where in edges:
        a, b = folders.get(src), folders.get(dst)
        if a is None or b is None or a == b or a not in home or b not in home:
            continue
        if src == DISPATCHER and dst.split(".")[0] in TOOLS:
            continue
        graph[a].add(b)
        (la, ga), (lb, gb) = home[a], home[b]
        if lb > la:
            out.setdefault(f"up: {a} -> {b}", f"{where}: {a} (layer {la}) imports {dst} of {b} (layer {lb}): "
                                              f"points up")
        elif lb == la and ga != gb:
            out.setdefault(f"sideways: {a} -> {b}", f"{where}: {a} imports {dst} of {b}: siblings of layer {la} "
                                                    f"never import each other")
    for loop in strongly_connected(graph):  # each pair that imports each other, else the loop as a whole
        pairs = [[a, b] for i, a in enumerate(loop) for b in loop[i + 1:] if b in graph[a] and a in graph[b]]
        for members in pairs or [loop]:
            out[f"cycle: {' <-> '.join(members)}"] = f"folders that import each other: {members}"
    return out


def folder_report(root: Path = ROOT, doc: str | None = None) -> dict[str, str]:
    """folder_problems of the tree at `root` against the layer table of `doc` (docs/architecture.md by default)."""
    table = classify(layer_table(doc), doc)
    modules = project_files(root)
    folders = {name: folder_of(name, path, root) for name, path in modules.items()}
    layers = {name: owner(name, table) for name in modules if owner(name, table)}
    edges = []
    for name, path in sorted(modules.items()):
        for target, line, _ in imports(path, name, modules):
            while target not in modules and "." in target:  # `import a.b.c` of a name inside a module
                target = target.rsplit(".", 1)[0]
            if target in modules:
                edges.append((name, target, f"{path.relative_to(root)}:{line}"))
    return folder_problems(folders, layers, edges)


def test_folders_hold_one_layer_and_import_only_below():
    problems = folder_report()
    assert not problems, "folders against docs/architecture.md's layers:\n" + "\n".join(problems.values())


LAYERS_DOC = """## Layers

| layer | modules | what it holds |
|---|---|---|
| 1 | `vl.errors` | errors |
| 2 | `vl.quant` | formats |
| 3 | `vl.checkpoint` | loading |
| 4 | `vl.runtime` \\| `vl.hf` | siblings |
| 5 | `vl.cli` | the command |
| 6 | `eval` | a tool |

## Next
"""


def _plant(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_folder_check_catches_a_planted_upward_import_and_a_folder_cycle(tmp_path):
    """A tree that passes, then the same tree with one upward folder import (which closes a folder loop), a
    sideways one and a folder that holds two layers: each is reported, with the file and line of the import."""
    clean = {
        "vl/__init__.py": "",
        "vl/errors.py": "",
        "vl/quant/__init__.py": "",
        "vl/quant/fp8.py": "from vl.errors import VLError\n",
        "vl/checkpoint/__init__.py": "",
        "vl/checkpoint/load.py": "from vl.quant import fp8\n",
        "vl/runtime/__init__.py": "",
        "vl/runtime/engine.py": "import vl.checkpoint.load\n",
        "vl/hf/__init__.py": "",
        "vl/hf/model.py": "from vl.checkpoint.load import load\n",
        "vl/cli/__init__.py": "def main():\n    import eval.run\n",  # the dispatcher's arrow into a tool
        "vl/cli/flags.py": "from vl.errors import VLError\n",
        "eval/__init__.py": "",
        "eval/run.py": "from vl.cli.flags import add_flags\n",
    }
    _plant(tmp_path, clean)
    assert folder_report(tmp_path, LAYERS_DOC) == {}

    _plant(tmp_path, {
        "vl/quant/ptq.py": "def quantize():\n    from vl.checkpoint.load import load\n",  # up, closes a loop
        "vl/runtime/pipe.py": "from vl.hf import model\n",  # sideways
    })
    problems = folder_report(tmp_path, LAYERS_DOC)
    assert set(problems) == {"up: vl/quant/ -> vl/checkpoint/", "cycle: vl/checkpoint/ <-> vl/quant/",
                             "sideways: vl/runtime/ -> vl/hf/"}, problems
    assert problems["up: vl/quant/ -> vl/checkpoint/"].startswith("vl/quant/ptq.py:2: vl/quant/ (layer 2) imports")

    # one folder, one layer: a row that gives a module of vl/quant/ a layer of its own
    spans = folder_report(tmp_path, LAYERS_DOC.replace("| 4 | `vl.runtime`", "| 4 | `vl.quant.ptq`, `vl.runtime`"))
    assert spans["spans: vl/quant/"] == "vl/quant/ holds layers [2, 4]: vl.quant.ptq (4)"

    # a loop of three folders, no two of which import each other, is named as a whole
    _plant(tmp_path, {"vl/quant/ptq.py": "import vl.runtime.engine\n", "vl/runtime/pipe.py": ""})
    assert set(folder_report(tmp_path, LAYERS_DOC)) == {"up: vl/quant/ -> vl/runtime/",
                                                        "cycle: vl/checkpoint/ <-> vl/quant/ <-> vl/runtime/"}

    # the exemption is the dispatcher's alone: another module of vl/cli/ importing a tool is an arrow like any
    _plant(tmp_path, {"vl/quant/ptq.py": "", "vl/cli/chat.py": "import eval.run\n"})
    assert set(folder_report(tmp_path, LAYERS_DOC)) == {"up: vl/cli/ -> eval/", "cycle: eval/ <-> vl/cli/"}
