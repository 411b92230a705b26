"""`vl eval ...` / `python -m eval ...` / `accelerate launch -m eval ...`: batch evaluation from the command line.

    vl eval --model PATH --task TASK --data PATH --out DIR [--limit N] [--batch-size B] [--resume]
            [--thinking on|off] [--max-tiles N] [--fps F --max-frames N] [--video-pruning-rate Q]
            [--skip-blank-tiles on|off] [--token-pruning-rate R] [--sweep KEY=V1,V2,...] [--max-new-tokens N]
    vl eval score --task TASK --predictions FILE.jsonl      re-score a predictions file (no model)
    vl eval compare --task TASK BASE.jsonl OTHER.jsonl      OTHER minus BASE on shared items, paired interval
    vl eval tasks                                           list the task names
    vl eval make-data --out DIR [--per-family N]            write the synthetic_docs / _video / _audio sets

Exit status: 0 when every item has a final record (item errors are results, counted in the summary);
1 when items are missing or the server did not answer some (`unavailable`; the run also stops after
--max-connection-failures of those in a row): rerun with --resume; 1 also when no item was answered (there is
no score); 2 for a usage, data or model problem; 3 when the predictions log could not be written (disk full): the
records so far are intact, rerun with --resume.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, found {text!r}")
    return text == "on"


def build_parser() -> argparse.ArgumentParser:
    from eval.backend import EVAL_OPTIONS
    from eval.tasks import task_names
    from vl.cli.flags import add_option_flags
    from vl.options import spec

    p = argparse.ArgumentParser(prog="vl eval", description="Batch evaluation: resumable, distributed "
                                "(accelerate launch -m eval ...), scored exactly like lmms-eval. "
                                "`vl eval score --help` re-scores a predictions file; `vl eval compare --help` "
                                "compares two; `vl eval make-data --help` writes the synthetic_docs / "
                                "synthetic_video data.")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model vl/demo)")
    p.add_argument("--task", required=True, help=f"one of: {', '.join(task_names())}")
    p.add_argument("--data", required=True, help="local dataset: JSONL/JSON with media paths, parquet file or "
                   "folder of shards, arrow file, or a datasets.save_to_disk folder")
    p.add_argument("--out", required=True, help="output folder (records/, predictions.jsonl, summary.json/.md)")
    p.add_argument("--split", default=None, help="split of a parquet folder / save_to_disk DatasetDict")
    p.add_argument("--media-root", default=None, help="folder media paths are relative to (default: the data "
                   "file's folder); paths may not leave it")
    p.add_argument("--limit", type=int, default=None, help="first N items only")
    p.add_argument("--batch-size", type=int, default=None, help="conversations generated together (default 1; "
                   "with --backend openai: --concurrency)")
    p.add_argument("--resume", action="store_true", help="continue a run in --out: skip finished items, redo "
                   "unfinished and retriable ones; records of another configuration are never reused")
    g = p.add_argument_group("request options (the same flags as vl chat; vl/options.py)")
    add_option_flags(g, [n for n in EVAL_OPTIONS if spec(n).flag], bools="on_off",
                     defaults={"thinking": False, "max_new_tokens": None},
                     helps={"thinking": "reasoning on|off (off: /no_think, the primary configuration; with "
                                        "on, raise --max-new-tokens)",
                            "max_new_tokens": "stop after N new tokens (default: the task's harness budget)"})
    p.add_argument("--sweep", default=None, metavar="KEY=V1,V2,...", help="one run per value of one request "
                   f"option ({', '.join(EVAL_OPTIONS)}; aliases max_tiles, evs); writes sweep.json/.md/.png")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default=None, help="bf16, fp16 or fp32 (default: the checkpoint's)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default: cuda:LOCAL_RANK if "
                   "available, else cpu)")
    p.add_argument("--item-timeout", type=float, default=None, help="seconds per item; past it the item is "
                   "recorded as timeout (the worker is replaced)")
    p.add_argument("--retries", type=int, default=2, help="in-run retries of a transient failure (default 2)")
    p.add_argument("--max-attempts", type=int, default=3, help="runs that may redo a retriable failure on "
                   "--resume (default 3)")
    p.add_argument("--isolation", choices=["process", "inline"], default="process", help="run the model in a "
                   "worker process (default; survives hangs and crashes) or inline")
    p.add_argument("--decode-sandbox", type=_on_off, default=True, help="decode media in killable subprocesses "
                   "(default on)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--backend", choices=["local", "openai"], default="local", help="local: the model in this "
                   "process (default); openai: any OpenAI-compatible server at --base-url (vl serve, vLLM, SGLang)")
    p.add_argument("--base-url", default=None, help="with --backend openai: the server, e.g. http://host:8000/v1")
    p.add_argument("--api-key", default=None, help="with --backend openai: sent as a bearer token (default: "
                   "$OPENAI_API_KEY when set)")
    p.add_argument("--served-model", default=None, help="with --backend openai: the model id (default: the one "
                   "the server lists)")
    p.add_argument("--concurrency", type=int, default=4, help="with --backend openai: requests in flight at once "
                   "(default 4); --batch-size defaults to it")
    p.add_argument("--read-timeout", type=float, default=600.0, help="with --backend openai: seconds the server may "
                   "send nothing before the item is recorded unavailable (retried by --resume; default 600)")
    p.add_argument("--max-connection-failures", type=int, default=3, metavar="N", help="with --backend openai: stop "
                   "the run after N items in a row the server did not answer (refused, dropped, stalled); the rest "
                   "is left for --resume (default 3; 0: never stop)")
    return p


def config_from_args(args: argparse.Namespace):
    from eval.runner import RunConfig
    from vl.cli.flags import flag_values

    import os

    model = args.model
    if args.backend == "openai":
        model = None
    elif model is None:
        from vl.directory import default_model

        model = default_model()
        if not (Path(model) / "config.json").exists():
            from eval.runner import RunOptionError

            raise RunOptionError(f"no --model given and the shipped demo model is not in {model} (no config.json); "
                                 "pass --model PATH")
    return RunConfig(task=args.task, data=args.data, out=args.out, model=model, split=args.split,
                     media_root=args.media_root, limit=args.limit,
                     batch_size=(args.batch_size if args.batch_size is not None
                                 else args.concurrency if args.backend == "openai" else 1),
                     **flag_values(args), seed=args.seed, dtype=args.dtype, device=args.device, retries=args.retries,
                     max_attempts=args.max_attempts, item_timeout_s=args.item_timeout, isolation=args.isolation,
                     decode_sandbox=args.decode_sandbox, resume=args.resume, progress=not args.no_progress,
                     backend=args.backend, base_url=args.base_url,
                     api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), served_model=args.served_model,
                     concurrency=args.concurrency, read_timeout_s=args.read_timeout,
                     max_connection_failures=args.max_connection_failures)


def make_data_main(argv: Sequence[str], make_data=None) -> int:
    """`vl eval make-data`: the project's own held-out sets, written by `make_data(kind, per_family, out, *,
    tile_size, seed) -> jsonl path`, which the `vl` command supplies (data_recipes.synthetic; eval never imports
    the data side)."""
    from eval.tasks import get_task, task_names
    from vl.errors import InputError, VLError

    made = [n for n in task_names() if get_task(n).made_by]
    p = argparse.ArgumentParser(prog="vl eval make-data", description="Write the held-out synthetic sets that "
                                f"`vl eval --task {'|'.join(made)}` reads: the test split of data_recipes.synthetic "
                                "(never trained on) as PNG pages, PDFs, MP4 clips and WAV sounds plus one JSONL per "
                                "task, drawn at the model's tile size. Prints the JSONL paths as JSON.")
    p.add_argument("--out", required=True, help="folder to write: DIR/document_test.jsonl, DIR/video_test.jsonl, "
                   "DIR/audio_test.jsonl, DIR/media/")
    p.add_argument("--tasks", default=",".join(made), help=f"comma-separated, of {', '.join(made)} (default: all)")
    p.add_argument("--per-family", type=int, default=100, help="items per family (default 100, the demo model "
                   "card's set; 8 document, 5 video and 2 audio families)")
    p.add_argument("--model", default=None, help="checkpoint whose tile size (config.json force_image_size; for "
                   "Omni the side of its video frame) pages and frames are drawn at (default: the shipped demo model)")
    p.add_argument("--tile-size", type=int, default=None, help="draw at this many pixels instead of the model's")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        if make_data is None:
            raise InputError("make-data is run by the `vl` command (`vl eval make-data ...`), which supplies the "
                             "synthetic generator; `python -m eval` does not reach data_recipes")
        if args.per_family < 1 or (args.tile_size is not None and args.tile_size < 1):
            raise InputError(f"--per-family and --tile-size must be >= 1, found {args.per_family} and "
                             f"{args.tile_size}")
        tasks = [get_task(name) for name in args.tasks.split(",")]
        unmade = [t.name for t in tasks if not t.made_by]
        if unmade:
            raise InputError(f"{', '.join(unmade)}: not generated here (its data is the public benchmark's); "
                             f"make-data writes {', '.join(made)}")
        tile = args.tile_size or _tile_size(args.model)
        written = {t.name: str(make_data(t.made_by, args.per_family, Path(args.out), tile_size=tile, seed=args.seed))
                   for t in tasks}
    except VLError as e:
        print(f"error [{e.code}]: {e}", file=sys.stderr)
        return 2
    print(json.dumps(written, indent=2))
    for name, path in written.items():
        print(f"next: {_next_command(name, path, args.model)}", file=sys.stderr)
    return 0


def _next_command(task: str, path: str, model: str | None) -> str:
    """The `vl eval` line that runs a set make-data wrote: on the model it was drawn for (its tile size), and for a
    set the demo model cannot answer (audio), on a model that hears, said so."""
    from eval.tasks import get_task

    run = f"--task {task} --data {shlex.quote(path)} --out runs/{task}"
    if model:
        return f"vl eval --model {shlex.quote(model)} {run}"
    if get_task(task).media_kind == "audio":
        return f"vl eval --model OMNI {run}   # OMNI: a model that hears (Nemotron 3 Nano Omni); the demo does not"
    return f"vl eval {run}"


def _tile_size(model: str | None) -> int:
    """The side in pixels the sets are drawn at: a Nano V2 VL checkpoint's tile (`force_image_size`); for Nemotron 3
    Nano Omni, which sees images at their own resolution, the tile its video path resizes a square frame to
    (`frame_grid`: 512 px for the released model)."""
    from vl.directory import checkpoint_kind, default_model, read_config
    from vl.errors import CheckpointError

    model = model or default_model()
    raw = read_config(Path(model))
    tile = raw.get("force_image_size")
    if isinstance(tile, int):
        return tile
    if checkpoint_kind(raw, Path(model)) == "nemotron_h_omni":
        from vl.processing.omni_processor import omni_processing_from_hf, read_processing_files
        from vl.processing.omni_video import frame_grid

        video = omni_processing_from_hf(*read_processing_files(model)).video
        return video.patch_size * frame_grid(1, 1, video)[0]  # the tile a square frame is resized to
    raise CheckpointError(f"{model}: config.json has no force_image_size (a text-only model?); pass --tile-size")


def main(argv: Sequence[str] | None = None, make_data=None) -> int:
    """`make_data`: the synthetic-set writer `vl eval make-data` runs (vl/cli/__init__.py supplies it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["make-data"]:
        return make_data_main(argv[1:], make_data)
    if argv[:1] == ["score"]:
        from eval.score import main as score_main

        return score_main(argv[1:])
    if argv[:1] == ["compare"]:
        from eval.score import compare_main

        return compare_main(argv[1:])
    if argv[:1] == ["tasks"]:
        from eval.tasks import get_task, task_names

        for name in task_names():
            print(f"{name:16s} {get_task(name).reference}")
        return 0
    args = build_parser().parse_args(argv)
    from eval.records import RecordsWriteError
    from vl.errors import VLError

    try:
        from eval.runner import Dist, Runner

        cfg = config_from_args(args)
        dist = Dist.from_env()
        if args.sweep:
            from eval.sweep import parse_sweep, run_sweep

            field, values = parse_sweep(args.sweep)
            table = run_sweep(cfg, field, values, dist=dist)
            if table is not None:
                print(json.dumps({"sweep": str(Path(cfg.out) / "sweep.json"), "plot": str(Path(cfg.out) / "sweep.png"),
                                  "rows": [{k: r[k] for k in ("label", "score", "vision_tokens_after", "n_error")}
                                           for r in table["rows"]]}, indent=2))
            return 0
        summary = Runner(cfg, dist=dist).run()
    except RecordsWriteError as e:
        print(f"error [{e.code}]: {e}", file=sys.stderr)
        return 3
    except FileNotFoundError as e:
        print(f"error [not_found]: {e}", file=sys.stderr)
        return 2
    except VLError as e:
        print(f"error [{e.code}]: {e}", file=sys.stderr)
        return 2
    if summary is None:  # not the main process
        return 0
    s, c = summary["scores"], summary["counts"]
    print(json.dumps({"task": s["task"], "score": s["score"], "scale": s["scale"], "metric": s["metric"],
                      "n": c["items"], "ok": c["ok"], "error": c["error"], "timeout": c["timeout"],
                      "unavailable": c["unavailable"], "missing": c["missing"], **({"note": s["note"]} if "note" in s
                                                                                   else {}),
                      "summary": str(Path(cfg.out) / "summary.json")}, indent=2))
    unfinished = [f"{n} item{'s' * (n != 1)} {what}" for n, what in (
        (c["missing"], "have no record"), (c["unavailable"], "could not reach the server (unavailable)")) if n]
    if unfinished:
        print(f"warning: {' and '.join(unfinished)}; rerun the same command with --resume", file=sys.stderr)
    if not c["ok"]:
        print("warning: no item was answered: there is no score", file=sys.stderr)
    return 1 if unfinished or not c["ok"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
