"""The `vl` command: one entry point, one subcommand per job; each lives with the code it drives (this package
holds `vl chat`, chat.py, and the flags every command shares, flags.py).

    vl app        [--model PATH] ...         Gradio app (ui/app.py)
    vl chat       --model PATH --image F --prompt "..." [--json]   (vl/cli/chat.py)
    vl eval       ... | score | compare | make-data   evaluation, re-scoring, two runs compared, the synthetic sets
    vl quantize   --format fp8|nvfp4 --model IN --out OUT
    vl bench      [--json] ...               speed and memory against transformers (vl/bench/run.py)
    vl train-demo ...                        train the demo model or a fine-tune of it (data_recipes/train.py)
    vl --version
"""

from __future__ import annotations

import importlib
import sys

from vl.directory import default_model  # noqa: F401 - `vl.cli.default_model` stays importable

# subcommand -> "module:function" taking argv (list[str]) and returning an exit code
COMMANDS = {
    "app": ("ui.app:main", "serve the Gradio app"),
    "chat": ("vl.cli.chat:main", "one question about images / a PDF / a video, answer streamed to stdout"),
    "eval": ("vl.cli:eval_main", "batch evaluation (vl eval score re-scores a predictions file, vl eval compare "
                                 "compares two, vl eval make-data writes the synthetic sets)"),
    "serve": ("vl.server.cli:main", "OpenAI-compatible server: /v1/models, /v1/chat/completions (docs/server.md)"),
    "quantize": ("vl.cli:quantize_main", "export a BF16 checkpoint to FP8 or NVFP4 (ModelOpt layout)"),
    "bench": ("vl.cli:bench_main", "speed and memory against transformers, measured in one process"),
    "train-demo": ("data_recipes.train:main", "train the demo model on synthetic documents and videos"),
}


def quantize_main(argv: list[str]) -> int:
    """`vl quantize` with the synthetic calibration documents and clips as the default data (the quantizer itself
    knows no data set; this dispatcher is the one place allowed to reach the tools above the library)."""
    from data_recipes.calibration import SYNTHETIC
    from vl.quantize.cli import main as quantize

    return quantize(argv, calib_source=SYNTHETIC)


def eval_main(argv: list[str]) -> int:
    """`vl eval`, whose `make-data` writes the synthetic held-out sets with data_recipes (eval never imports it)."""
    from eval.__main__ import main as eval_cli

    return eval_cli(argv, make_data=_write_synthetic_test_split)


def _write_synthetic_test_split(kind: str, per_family: int, out, *, tile_size: int, seed: int):
    """`per_family` test-split samples of every family of `kind` -> out/<kind>_test.jsonl plus media files."""
    from data_recipes.synthetic import export_split, families

    return export_split(kind, "test", per_family * len(families(kind)), out, tile_size=tile_size, seed=seed)


def bench_main(argv: list[str]) -> int:
    """`vl bench`, whose FP8/NVFP4 table calibrates and evaluates on the synthetic documents."""
    from data_recipes.calibration import SYNTHETIC
    from vl.bench.run import main as bench

    return bench(argv, calib_source=SYNTHETIC)


def version() -> str:
    """The installed distribution's version (pyproject.toml), or "unknown" when run from a bare checkout."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("nemotron-vl")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-V"]):
        print(f"vl {version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: vl <command> [options]   (vl --version)\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    target, _ = COMMANDS[argv[0]]
    module, func = target.split(":")
    from vl.errors import VLError
    from vl.runtime.cpu import heap

    heap.share_one_arena()  # before any thread of the command allocates: one malloc arena (vl/runtime/cpu/heap.py)

    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except VLError as exc:  # a typed error a command let through: its code and message, not a traceback
        print(f"error [{exc.code}]: {exc}", file=sys.stderr)
        return 2
