"""Flags shared by `vl` commands: one spelling, one help text and one check wherever a flag appears.

`vl chat` uses all of them; other commands (`vl serve`, `vl app`, `vl eval`) add the groups they need, so
`--thinking`, `--dtype` or `--max-tiles` mean the same thing everywhere. The checks run before any model loads:
a missing file or a contradictory flag is reported at once, with a typed error code (docs/app_and_cli.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vl.errors import GenerationOptionError, InputError, MediaNotFoundError

DTYPES = ("bf16", "fp32")
# one cap on rendered PDF pages for interactive use (`vl chat` and `vl app`); a page range reaches past it
INTERACTIVE_PDF_PAGES = 32


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, metavar="DIR",
                   help="checkpoint directory (default: the shipped demo model, which reads only the synthetic "
                        "documents and clips it was trained on)")
    g.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights and compute dtype (default: the checkpoint's)")
    g.add_argument("--device-map", default=None, metavar="MAP",
                   help='accelerate device map, e.g. "auto" or "cpu" (default: CPU, or the first GPU)')


def add_generation_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="reasoning before the answer (/think) or not (/no_think); default: the model's default")
    g.add_argument("--think", dest="thinking", choices=["on", "off", "default"], help=argparse.SUPPRESS)
    g.add_argument("--reasoning-budget", type=int, default=None, metavar="N",
                   help="close the think block after N tokens (default: no budget)")
    g.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                   help="stop after N new tokens, reasoning included (default 256)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")


def add_media_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("media")
    g.add_argument("--image", action="append", default=[], metavar="FILE", help="image file (repeatable, up to 4)")
    g.add_argument("--pdf", default=None, metavar="FILE",
                   help=f"PDF file (at most {INTERACTIVE_PDF_PAGES} pages rendered; pick them with --pages)")
    g.add_argument("--pages", default=None, metavar="RANGE", help='pages of --pdf, e.g. "1-3,7" (default: all)')
    g.add_argument("--video", default=None, metavar="FILE", help="video file")
    g.add_argument("--max-tiles", type=int, default=None, metavar="N",
                   help="at most N 512-px tiles per image or page, 1..12 (default: the model's, 12)")
    g.add_argument("--skip-blank-tiles", action="store_true",
                   help="drop blank (whitespace) tiles of images and pages before the vision encoder")
    g.add_argument("--token-pruning-rate", type=float, default=0.0, metavar="Q",
                   help="fraction of document vision tokens removed as redundant background, 0..0.95 (default 0)")
    g.add_argument("--fps", type=float, default=2.0, metavar="F", help="video frames sampled per second (default 2)")
    g.add_argument("--max-frames", type=int, default=128, metavar="N", help="at most N video frames (default 128)")
    g.add_argument("--video-pruning-rate", type=float, default=None, metavar="Q",
                   help="EVS: fraction of video tokens removed as repeats of the previous frame, 0..0.95 "
                        "(default: the checkpoint's)")


def add_json_flag(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object on stdout")


def thinking_value(args) -> bool | None:
    return {"on": True, "off": False}.get(getattr(args, "thinking", None))


def _rate(name: str, value) -> None:
    if value is not None and not 0.0 <= value <= 0.95:
        raise GenerationOptionError(f"{name} must be between 0 and 0.95, found {value}")


def check_media_flags(args) -> None:
    """Everything about the media flags that can be checked without the model: files exist and are files,
    `--pages` comes with `--pdf`, numbers are in range. Raises typed errors (`file_not_found`, ...)."""
    for flag, paths in (("--image", args.image), ("--pdf", [args.pdf] if args.pdf else []),
                        ("--video", [args.video] if args.video else [])):
        for f in paths:
            path = Path(f)
            if not path.exists():
                raise MediaNotFoundError(f"{flag} {f}: no such file; check the path")
            if not path.is_file():
                raise MediaNotFoundError(f"{flag} {f}: not a file (a folder?); pass a file")
    if args.pages is not None and not args.pdf:
        raise InputError("--pages selects pages of a PDF, and no --pdf was given; add --pdf FILE or drop --pages")
    if args.max_tiles is not None and not 1 <= args.max_tiles <= 12:
        raise GenerationOptionError(f"--max-tiles must be 1..12 (the models were trained with up to 12), "
                                    f"found {args.max_tiles}")
    if not 0.1 <= args.fps <= 30:
        raise GenerationOptionError(f"--fps must be between 0.1 and 30, found {args.fps}")
    if not 1 <= args.max_frames <= 512:
        raise GenerationOptionError(f"--max-frames must be 1..512, found {args.max_frames}")
    _rate("--token-pruning-rate", args.token_pruning_rate)
    _rate("--video-pruning-rate", args.video_pruning_rate)


def check_generation_flags(args) -> None:
    if args.max_new_tokens < 1:
        raise GenerationOptionError(f"--max-new-tokens must be at least 1, found {args.max_new_tokens}")
    if args.reasoning_budget is not None and args.reasoning_budget < 0:
        raise GenerationOptionError(f"--reasoning-budget must be >= 0, found {args.reasoning_budget}")
    if not 0.0 <= args.temperature <= 2.0:
        raise GenerationOptionError(f"--temperature must be between 0 and 2, found {args.temperature}")


def media_content(args) -> list[dict]:
    """The message parts for the media flags, in the order images, PDF, video."""
    content = [{"type": "image", "image": f} for f in args.image]
    if args.pdf:
        content.append({"type": "pdf", "pdf": args.pdf})
    if args.video:
        content.append({"type": "video", "video": args.video})
    return content


def processor_kwargs(args) -> dict:
    """`Engine.chat` keywords for the media flags."""
    out = dict(fps=args.fps, max_frames=args.max_frames, pages=args.pages, skip_blank_tiles=args.skip_blank_tiles,
               token_pruning_rate=args.token_pruning_rate, video_pruning_rate=args.video_pruning_rate)
    if args.max_tiles is not None:
        out["max_num_tiles"] = args.max_tiles
    return out
