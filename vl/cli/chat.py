"""`vl chat`: one question about images, a PDF, a video or audio, from the command line.

    vl chat [--model DIR] --image F | --pdf F [--pages 1-3] | --video F [--no-audio] | --audio F --prompt "..."
            [--thinking on] [--json]

Made for pipes: only the answer goes to stdout (streamed; with `--json`, one JSON object at the end instead);
the demo-model warning, progress (pages rendered, frames decoded, tiles encoded), the reasoning, the stats and
what went wrong go to stderr. Every flag, the checkpoint's config.json and every media file (read as the model
will read it) are checked before the model loads, so a typo or an unreadable file costs nothing; so is `--audio`
given to a model without an audio encoder. Exit codes:
0 answered; 2 a typed error (`error [code]: ...`; with `--json` also `{"error": {"code", "message"}}` on stdout);
3 no complete answer (the reasoning never closed, the answer is empty, or --max-new-tokens cut it; stderr
says which); 130 stopped with Ctrl-C. The JSON schema is in docs/app_and_cli.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from vl.cli.flags import (
    add_generation_flags,
    add_json_flag,
    add_media_flags,
    add_model_flags,
    check_generation_flags,
    check_media_files,
    check_media_flags,
    media_content,
    name_the_file,
    options_from_args,
)
from vl.config.omni import omni_config_from_hf
from vl.directory import checkpoint_kind, default_model, read_config, resolve_dir, synthetic_only
from vl.errors import NoAudioError, VLError
from vl.runtime.outcome import finish_label, finish_note

DESCRIPTION = ("one question about images / a PDF / a video / audio; the answer on stdout, everything else on "
               "stderr")
EXIT_ANSWERED, EXIT_ERROR, EXIT_INCOMPLETE, EXIT_STOPPED = 0, 2, 3, 130
DEMO_WARNING = ("note: this is the shipped demo model, trained only on small synthetic documents and clips; it "
                "cannot read real photos, papers or videos (its answers about them are noise). Pass --model DIR "
                "with a real checkpoint for those.")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vl chat", description=DESCRIPTION)
    p.add_argument("--prompt", required=True, help="the question")
    add_model_flags(p)
    add_media_flags(p)
    add_generation_flags(p)
    add_json_flag(p, "answer, reasoning, finish reason and stats")
    return p.parse_args(argv)


class Progress:
    """One progress line on stderr: redrawn in place on a terminal, one line per stage otherwise."""

    def __init__(self, stream=None, min_interval_s: float = 0.1):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last_what, self.last_t, self.open, self.min_interval_s = None, 0.0, False, min_interval_s

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        finished = total and done >= total
        if what == self.last_what and not finished and now - self.last_t < self.min_interval_s:
            return
        if not self.tty and what == self.last_what and not finished:
            return
        self.last_t = now
        if total:
            width = 20
            bar = "#" * (width * done // total) + "." * (width - width * done // total)
            line = f"{what} [{bar}] {done}/{total}"
        else:
            line = f"{what}…" if not done else f"{what}: {done}"
        if self.tty:
            self.stream.write(f"\r\033[K{line}")
            self.open = True
        elif what != self.last_what or finished:
            self.stream.write(line + "\n")
        self.last_what = what
        self.stream.flush()

    def end(self) -> None:
        if self.open:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.open = False


def _stats_line(result) -> str:
    s = result.stats
    reduced = (f", vision tokens {s.vision_tokens_before} -> {s.vision_tokens_after}"
               if s.vision_tokens_before else "")
    heard = f", audio tokens {s.audio_tokens}" if s.audio_tokens else ""
    return (f"[{s.prompt_tokens} prompt tokens{reduced}{heard}, {s.new_tokens} new, ttft {s.time_to_first_token_s:.2f} s, "
            f"{s.decode_tokens_per_s:.1f} tok/s, finished by: {finish_label(result)}]")


def incomplete_note(result, ignore_eos: bool = False) -> str | None:
    """Why there is no complete answer (exit code 3), or None: the reasoning never closed (the shared wording of
    vl/runtime/outcome.py), the answer is empty, or the token limit cut the answer. With --ignore-eos the limit is
    the requested end, not a cut."""
    note = finish_note(result, limit_name="--max-new-tokens", budget_hint="--reasoning-budget")
    if note:
        return note
    if not result.answer.strip():
        advice = "raise --max-new-tokens" if result.finish_reason == "length" else "ask again or rephrase"
        return (f"the model ended with an empty answer ({finish_label(result)}, {result.stats.new_tokens} new "
                f"tokens); {advice}")
    if result.finish_reason == "length" and not ignore_eos:
        return (f"the answer stopped at the token limit ({result.stats.new_tokens} new tokens) and may be cut "
                f"short; raise --max-new-tokens")
    return None


def result_json(result, model: str, note: str | None = None) -> dict:
    """The --json document; `stats` is every field of the result's `Stats`, so fields added there appear here."""
    stats = _jsonable(result.stats.as_dict())
    for key, digits in (("time_to_first_token_s", 4), ("decode_tokens_per_s", 2), ("total_s", 4)):
        stats[key] = round(stats[key], digits)
    return {"answer": result.answer, "reasoning": result.reasoning, "finish_reason": result.finish_reason,
            "finished_by": finish_label(result), "reasoning_truncated": result.reasoning_truncated,
            "note": note, "model": model, "stats": stats}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return x.tolist()
    return x if isinstance(x, (str, int, float, bool)) or x is None else str(x)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    err = sys.stderr
    try:
        check_media_flags(args)
        check_generation_flags(args)
        options = options_from_args(args)
        model = args.model or default_model()
        directory = resolve_dir(model)
        raw = read_config(directory)
        check_hears(args, raw, checkpoint_kind(raw, directory), model)
        check_media_files(args, options)
        return _run(args, options, model, err)
    except VLError as exc:
        name_the_file(args, exc)
        if args.json:
            print(json.dumps({"error": {"code": exc.code, "message": str(exc)}}))
        print(f"error [{exc.code}]: {exc}", file=err)
        return EXIT_ERROR


def check_hears(args, raw: dict, kind: str, model: str) -> None:
    """`--audio` needs a model with an audio encoder: Nemotron 3 Nano Omni with an `audio_config` (read by the one
    config reader the processor uses). Checked from config.json alone, before the model loads."""
    if not args.audio:
        return
    if kind == "nemotron_h_omni":
        if omni_config_from_hf(raw, where=f"{model}/config.json").audio is not None:
            return
        why = "this Nemotron 3 Nano Omni checkpoint has no audio encoder (its config.json has no audio_config)"
    else:
        why = f"{model} is a {kind} checkpoint, which has no audio encoder"
    raise NoAudioError(f"--audio: {why}; pass --model DIR with a model that hears (Nemotron 3 Nano Omni), or drop "
                       "--audio")


def _run(args, options, model: str, err) -> int:
    if synthetic_only(model):
        print(DEMO_WARNING, file=err)
    print(f"loading {model}…", file=err, flush=True)  # before the imports: they alone take seconds
    from vl.runtime.engine import Engine

    engine = Engine.from_pretrained(model, dtype=args.dtype, device_map=args.device_map)
    content = media_content(args) + [{"type": "text", "text": args.prompt}]
    progress, cancel = Progress(err), threading.Event()
    stream = engine.chat([{"role": "user", "content": content}], options, stream=True, temperature=args.temperature,
                         cancel=cancel, progress=progress)
    kind = None
    try:
        for event in stream:
            progress.end()
            if args.json:
                continue
            if event.kind != kind:
                if event.kind == "reasoning":
                    err.write("[reasoning]\n")
                elif kind == "reasoning":
                    err.write("\n[answer]\n")
                kind = event.kind
            out = sys.stdout if event.kind == "answer" else err
            out.write(event.text)
            out.flush()
    except KeyboardInterrupt:
        cancel.set()
        progress.end()
        print("\nstopped (Ctrl-C)", file=err)
        return EXIT_STOPPED
    progress.end()
    result = stream.result
    note = incomplete_note(result, args.ignore_eos)
    if args.json:
        print(json.dumps(result_json(result, model, note), ensure_ascii=False))
    else:
        if kind == "answer":
            sys.stdout.write("\n")
        elif kind == "reasoning":
            err.write("\n")
        sys.stdout.flush()
    for n in result.stats.notes:
        print(f"note: {n}", file=err)
    print(_stats_line(result), file=err)
    if note:
        print(f"no complete answer (exit code {EXIT_INCOMPLETE}): {note}", file=err)
        return EXIT_INCOMPLETE
    return EXIT_ANSWERED
