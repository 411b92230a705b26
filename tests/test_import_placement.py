"""Imports sit at the top of a module; an import inside a function is there only to defer a heavy or optional
dependency that the module does not already pay for at import time (so `import vl`, `vl --help`, `vl chat --help`
and the transformers registration stay light, and the GPU extras stay optional). The layer rule itself is
tests/test_imports.py.

A function-level import is accepted when what it imports is, or imports at its own top (transitively), a module
of HEAVY that the importing module's own top-level imports do not already bring in, or when it sits in one of the
files of EXEMPT (the command dispatchers and the lazy facades that `import vl` runs). Anything else belongs at the
top of the file.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

from test_imports import ROOT, module_name

CHECKED = ("vl", "ui", "eval", "token_reduction")
PROJECT = ("token_reduction", "vl", "data_recipes", "eval", "ui", "scripts")

# Heavy or optional third-party modules: deferring these is worth a function-level import. Times are a fresh
# interpreter's `python -X importtime -c "import M"` (cumulative) on the 2-core build machine, best of 3.
HEAVY = {
    "torch": "4.6 s",
    "torchvision": "pulls torch",
    "transformers": "3.8 s (with its torch import)",
    "timm": "12 s (torch + torchvision + its model registry)",
    "accelerate": "6 s",
    "gradio": "10 s",
    "gradio_client": "1 s; optional ([dev] extra)",
    "datasets": "2.4 s",
    "pyarrow": "0.46 s",
    "matplotlib": "0.8 s",
    "numpy": "0.4 s",
    "uvicorn": "0.47 s",
    "fastapi": "0.8 s",
    "httpx": "0.14 s; only the remote backends and URL fetching need it",
    "openai": "1.4 s; optional ([dev] extra)",
    "decord": "0.14 s; video only",
    "av": "0.11 s; video only",
    "pypdfium2": "0.16 s; PDF only",
    "tqdm.auto": "0.34 s (notebook detection)",
    "huggingface_hub": "0.8 s for `from huggingface_hub import snapshot_download` (its hub client); the package alone "
                       "defers everything",
    "mamba_ssm": "optional ([gpu] extra)",
    "causal_conv1d": "optional ([gpu] extra)",
    "playwright": "optional ([dev] extra)",
}


# Files exempt as a whole, and why:
EXEMPT = {
    # entry points that dispatch to their subcommands: a subcommand's code is imported only when it runs, so that
    # `vl --help`, `vl --version` and `vl eval --help` answer at once whatever the subcommands cost to import
    "vl.cli": "dispatcher",
    "eval.__main__": "dispatcher",
    # the lazy facades `import vl` runs: their parts are imported on first use, so that `import vl` stays ~1 ms
    # (even the standard library's dataclasses/inspect, which any part brings, cost more than that)
    "vl": "facade",
    "vl.hf": "facade (transformers registration; its parts load when transformers asks for them)",
}


def _heavy_name(module: str) -> str | None:
    for name in HEAVY:
        if module == name or module.startswith(name + "."):
            return name
    return None


@functools.lru_cache(maxsize=None)
def _files() -> dict[str, Path]:
    out = {}
    for pkg in PROJECT:
        for path in (ROOT / pkg).rglob("*.py"):
            out[module_name(path)] = path
    return out


def _resolve(node, name: str, is_pkg: bool) -> list[str]:
    """The modules an import statement names (`from pkg import sub` names the submodule when there is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = name.split(".")
        base = base[: len(base) - node.level + (1 if is_pkg else 0)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    files = _files()
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names]


@functools.lru_cache(maxsize=None)
def _parsed(name: str):
    """(top-level imports, [(line, [targets]) of imports inside functions or classes]) of a project module."""
    path = _files()[name]
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    top, inner = [], []

    def walk(nodes, at_top):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = _resolve(node, name, is_pkg)
                if at_top:
                    top.extend(targets)
                else:
                    inner.append((node.lineno, targets))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                walk(ast.iter_child_nodes(node), False)
            else:  # module-level if / try / with blocks run at import time
                walk(ast.iter_child_nodes(node), at_top)

    walk(tree.body, True)
    return tuple(top), tuple(inner)


def _project_module(target: str) -> str | None:
    files = _files()
    while target and target not in files:
        target = target.rpartition(".")[0]
    return target or None


def _edges(module: str) -> tuple[list[str], set[str]]:
    """(project modules, HEAVY modules) that importing `module` runs or loads directly: its parent packages'
    __init__ files (importing a.b.c runs a and a.b first) and its own top-level imports."""
    parts = module.split(".")
    mods = [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in _files()]
    heavy = set()
    for t in _parsed(module)[0]:
        if t.split(".")[0] in PROJECT:
            found = _project_module(t)
            if found:
                mods.append(found)
        elif _heavy_name(t):
            heavy.add(_heavy_name(t))
    return mods, heavy


@functools.lru_cache(maxsize=None)
def heavy_on_import(target: str) -> frozenset[str]:
    """The HEAVY modules that importing `target` loads (its top-level imports, its parent packages, transitively)."""
    if target.split(".")[0] not in PROJECT:
        found = _heavy_name(target)
        return frozenset([found] if found else [])
    start = _project_module(target)
    seen, todo, out = set(), [start] if start else [], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        mods, heavy = _edges(module)
        out |= heavy
        todo.extend(mods)
    return frozenset(out)


def test_function_level_imports_only_defer_heavy_or_optional_modules():
    bad = []
    for name, path in sorted(_files().items()):
        if name.split(".")[0] not in CHECKED or name in EXEMPT:
            continue
        already = heavy_on_import(name)
        for line, targets in _parsed(name)[1]:
            for target in dict.fromkeys(targets):
                if not heavy_on_import(target) - already:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} inside a function; it defers "
                               f"nothing heavy (see HEAVY): move it to the top of the file")
    assert not bad, f"{len(bad)} function-level imports:\n" + "\n".join(bad)


def test_the_rule_sees_what_it_should():
    """The closure follows top-level imports and parent packages: the engine brings torch, `vl` (the facade) does
    not, and a stdlib module is never heavy."""
    assert "torch" in heavy_on_import("vl.runtime.engine")
    assert "torch" not in heavy_on_import("vl") and "transformers" not in heavy_on_import("vl.hf")
    assert heavy_on_import("json") == frozenset() and heavy_on_import("torch.distributed") == {"torch"}


def test_command_help_needs_no_torch():
    """`vl --help`, `vl chat --help` and `vl serve --help` answer at once: their modules import no torch (4-9 s)."""
    code = ("import sys, vl.cli, vl.cli.chat, vl.server.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'gradio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
