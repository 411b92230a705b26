"""The `vl` command: one entry point, one subcommand per job; each lives with the code it drives.

    vl app        [--model PATH] ...         Gradio app (ui/app.py)
    vl chat       --model PATH --image F --prompt "..."
    vl eval       ... | score ... | compare  batch evaluation, re-scoring, two runs compared (eval/)
    vl quantize   --format fp8|nvfp4 --model IN --out OUT
    vl bench      [--json] ...               speed and memory against transformers (vl/bench.py)
    vl train-demo ...                        train the demo model or a fine-tune of it (data_recipes/train.py)
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> "module:function" taking argv (list[str]) and returning an exit code
COMMANDS = {
    "app": ("ui.app:main", "serve the Gradio app"),
    "chat": ("vl.cli:chat_main", "one question about images / a PDF / a video, answer streamed to stdout"),
    "eval": ("eval.__main__:main", "batch evaluation (vl eval score re-scores a predictions file, vl eval compare "
                                   "compares two)"),
    "serve": ("vl.server.cli:main", "OpenAI-compatible server: /v1/models, /v1/chat/completions (docs/server.md)"),
    "quantize": ("vl.quant.cli:main", "export a BF16 checkpoint to FP8 or NVFP4 (ModelOpt layout)"),
    "bench": ("vl.bench:main", "speed and memory against transformers, measured in one process"),
    "train-demo": ("data_recipes.train:main", "train the demo model on synthetic documents and videos"),
}


def default_model() -> str:
    """The shipped demo checkpoint (package data)."""
    from pathlib import Path

    return str(Path(__file__).parent / "demo")


def chat_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="vl chat", description=COMMANDS["chat"][1])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model)")
    p.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    p.add_argument("--pdf", default=None, help="PDF file")
    p.add_argument("--pages", default=None, help='PDF page range, e.g. "1-3,7"')
    p.add_argument("--video", default=None, help="video file")
    p.add_argument("--prompt", required=True)
    p.add_argument("--think", choices=["on", "off", "default"], default="default")
    p.add_argument("--reasoning-budget", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default=None)
    p.add_argument("--device-map", default=None)
    p.add_argument("--video-pruning-rate", type=float, default=None)
    args = p.parse_args(argv)
    from vl.runtime.engine import Engine

    content = [{"type": "image", "image": f} for f in args.image]
    if args.pdf:
        content.append({"type": "pdf", "pdf": args.pdf})
    if args.video:
        content.append({"type": "video", "video": args.video})
    content.append({"type": "text", "text": args.prompt})
    engine = Engine.from_pretrained(args.model or default_model(), dtype=args.dtype, device_map=args.device_map)
    stream = engine.chat([{"role": "user", "content": content}], stream=True, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, reasoning_budget=args.reasoning_budget,
                         thinking={"on": True, "off": False}.get(args.think), pages=args.pages,
                         video_pruning_rate=args.video_pruning_rate)
    kind = None
    for event in stream:
        if event.kind != kind:
            sys.stdout.write("\n[reasoning]\n" if event.kind == "reasoning" else "\n[answer]\n")
            kind = event.kind
        sys.stdout.write(event.text)
        sys.stdout.flush()
    s = stream.result.stats
    sys.stdout.write(f"\n\n[{s.prompt_tokens} prompt tokens, {s.new_tokens} new, ttft "
                     f"{s.time_to_first_token_s:.2f}s, {s.decode_tokens_per_s:.1f} tok/s]\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: vl <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    target, _ = COMMANDS[argv[0]]
    module, func = target.split(":")
    from vl.errors import VLError

    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except VLError as exc:  # a typed error a command let through: its code and message, not a traceback
        print(f"error [{exc.code}]: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
