"""Flags shared by `vl` commands: one spelling, one help text and one check wherever a flag appears.

`vl chat` uses all of them; other commands (`vl serve`, `vl app`, `vl eval`) add the groups they need, so
`--thinking`, `--dtype` or `--max-tiles` mean the same thing everywhere. The per-request option flags are
derived from `RequestOptions` (vl/options.py): a new option with a `flag` appears here by itself. The checks
run before any model loads: a missing file, a contradictory flag or a value out of range is reported at once,
with a typed error code (docs/app_and_cli.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

from vl.errors import GenerationOptionError, InputError, MediaError, MediaNotFoundError, TooManyItemsError, naming
from vl.options import GENERATION, PROCESSOR, REDUCTION, RequestOptions, names, spec, specs
from vl.processing.limits import DEFAULT_LIMITS

DTYPES = ("bf16", "fp32")
# one cap on rendered PDF pages for interactive use: the default of `vl chat --max-pages` (the request option,
# vl/options.py) and the app's page cap; a page range reaches past it
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


def add_option_flags(g, names, *, bools: str = "switch", defaults: dict | None = None,
                     helps: dict | None = None) -> None:
    """The flags of the per-request options `names`, as `RequestOptions` declares them (vl/options.py): flag,
    type, default, metavar and help come from there. A yes/no option is a switch (`--skip-blank-tiles`), or with
    `bools="on_off"` takes on|off; a yes/no option that may also be None (`--thinking`) takes an optional on|off.
    `defaults` overrides a record default for this command (e.g. `vl eval` runs /no_think), `helps` a help text
    that must say so."""
    defaults, helps = defaults or {}, helps or {}
    for name in names:
        s = dataclasses.replace(spec(name), help=helps.get(name, spec(name).help))
        default = defaults.get(name, getattr(RequestOptions(), name))
        if s.kind is bool and s.nullable and bools == "switch":  # `--thinking` alone is on; `--thinking off` too
            g.add_argument(s.flag, dest=name, nargs="?", const="on", choices=["on", "off"],
                           default=_on_off_text(default), metavar="on|off",
                           help=f"{s.help}; {s.flag} alone turns it on")
        elif s.kind is bool and bools == "switch":
            g.add_argument(s.flag, dest=name, action="store_true", default=default, help=s.help)
        elif s.kind is bool:
            g.add_argument(s.flag, dest=name, type=_on_off, default=default, metavar="on|off",
                           help=f"{s.help} (default {_on_off_text(default)})")
        elif s.kind is dict:  # repeatable NAME=VALUE; read into one object by `flag_values`
            g.add_argument(s.flag, dest=name, action="append", type=_name_value, default=None, metavar=s.metavar,
                           help=f"{s.help}; repeatable, VALUE read as JSON (true, 3, \"text\") or else as text")
        else:
            g.add_argument(s.flag, dest=name, type=s.kind, default=default, metavar=s.metavar, help=s.help)


def flag_names(**where) -> tuple[str, ...]:
    """The options with a CLI flag, among those whose spec matches `where` (vl/options.py `names`)."""
    return tuple(n for n in names(**where) if spec(n).flag)


def add_generation_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    add_option_flags(g, flag_names(acts=GENERATION))
    g.add_argument("--think", dest="thinking", choices=["on", "off", "default"], help=argparse.SUPPRESS)
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")


def add_media_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("media")
    g.add_argument("--image", action="append", default=[], metavar="FILE", help="image file (repeatable, up to 4)")
    g.add_argument("--pdf", default=None, metavar="FILE",
                   help=f"PDF file (at most {INTERACTIVE_PDF_PAGES} pages rendered unless --max-pages says otherwise; "
                        f"pick them with --pages)")
    g.add_argument("--video", default=None, metavar="FILE", help="video file")
    g.add_argument("--audio", action="append", default=[], metavar="FILE",
                   help=f"audio file: WAV, FLAC, MP3, Ogg/Opus, M4A/AAC (repeatable, up to "
                        f"{DEFAULT_LIMITS.max_audios}; models with an audio encoder, such as Nemotron 3 Nano Omni)")
    add_option_flags(g, flag_names(acts=PROCESSOR) + flag_names(acts=REDUCTION),
                     defaults={"max_pages": INTERACTIVE_PDF_PAGES},
                     helps={"max_pages": f"render at most N pages of --pdf (default {INTERACTIVE_PDF_PAGES}, the "
                                         f"interactive cap; the processor's own cap still applies)"})
    g.add_argument("--no-audio", dest="use_audio_in_video", action="store_const", const="off",
                   help="do not hear the --video's sound track (= --with-audio off)")


def add_json_flag(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object on stdout")


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, found {text!r}")
    return text == "on"


def _name_value(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, found {text!r}")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def _on_off_text(value):
    return None if value is None else "on" if value else "off"


def flag_values(args) -> dict:
    """{option name: value} for every option flag the parser has (on|off read as True/False)."""
    out = {}
    for s in specs():
        if s.flag is None or not hasattr(args, s.name):
            continue
        value = getattr(args, s.name)
        if s.kind is bool and isinstance(value, str):  # on|off; "default" (the old --think spelling) = None
            value = {"on": True, "off": False}.get(value)
        if s.kind is dict and isinstance(value, list):  # (name, value) pairs of a repeatable flag
            names_given = [n for n, _ in value]
            twice = sorted({n for n in names_given if names_given.count(n) > 1})
            if twice:
                raise GenerationOptionError(f"{s.flag} sets {', '.join(twice)} more than once; set each once")
            value = dict(value)
        out[s.name] = value
    return out


def options_from_args(args, base: RequestOptions | None = None) -> RequestOptions:
    """The request options the parsed flags ask for, checked: a value out of range is a `bad_generation_option`
    error naming the flag."""
    given = {name: spec(name).check(value, spec(name).flag) for name, value in flag_values(args).items()}
    return RequestOptions.from_kwargs(base, **given)


def check_media_flags(args) -> None:
    """Everything about the media flags that can be checked without the model: files exist and are files,
    `--pages` comes with `--pdf`. Raises typed errors (`file_not_found`, ...); the option flags' ranges are
    checked by `options_from_args`."""
    audio = args.audio
    for flag, paths in (("--image", args.image), ("--pdf", [args.pdf] if args.pdf else []),
                        ("--video", [args.video] if args.video else []), ("--audio", audio)):
        for f in paths:
            path = Path(f)
            if not path.exists():
                raise MediaNotFoundError(f"{flag} {f}: no such file; check the path")
            if not path.is_file():
                raise MediaNotFoundError(f"{flag} {f}: not a file (a folder?); pass a file")
    if len(audio) > DEFAULT_LIMITS.max_audios:
        raise TooManyItemsError(f"--audio is given {len(audio)} times; at most {DEFAULT_LIMITS.max_audios} audio "
                                f"files per request")
    if args.pages is not None and not args.pdf:
        raise InputError("--pages selects pages of a PDF, and no --pdf was given; add --pdf FILE or drop --pages")


def check_media_files(args, options: RequestOptions) -> None:
    """Each media file checked the way the model's processor (default limits, in-process) will check it, before
    the model loads, without decoding it: an image gets every check made before its pixels are decoded (format by
    content, structure, size: `sniff_image`), a PDF's page tree is opened and the pages `options` select are
    checked against the page cap, a video's container header is probed. A file the model cannot read is refused
    with the processor's typed error, named by its flag and path, at once rather than after a load of many
    seconds; damage inside compressed pixel data still shows only when the processor decodes."""

    def named(flag, f, check):
        with naming(f"{flag} {f}"):
            check()

    if args.image:
        from vl.processing.images import sniff_image

        for f in args.image:
            named("--image", f, lambda: sniff_image(f, DEFAULT_LIMITS))
    if args.pdf:
        from vl.processing.documents import DEFAULT_SCALE, open_pdf_pages

        limits = DEFAULT_LIMITS  # a request's max_pages only lowers the cap (vl.processing.Processor._pdf_pages)
        if options.max_pages is not None and options.max_pages < limits.max_pdf_pages:
            limits = dataclasses.replace(limits, max_pdf_pages=options.max_pages)
        scale = options.pdf_scale or DEFAULT_SCALE
        named("--pdf", args.pdf, lambda: open_pdf_pages(args.pdf, pages=options.pages, scale=scale, limits=limits))
    if args.video:
        from vl.processing.video import probe_video

        named("--video", args.video, lambda: probe_video(args.video, DEFAULT_LIMITS))
    if args.audio:
        from vl.processing.audio import probe_audio

        for f in args.audio:
            named("--audio", f, lambda: probe_audio(f, DEFAULT_LIMITS))


_ITEM = re.compile(r"(image|video|audio) (\d+) of \d+")  # how the processor names one item of several


def name_the_file(args, exc: Exception) -> None:
    """A media error raised by the request (after the checks above passed: damage inside the data, an empty
    recording) renamed after the flag and file it came from, as those checks name theirs ("--audio b.wav: ..."):
    the processor names an item of several by kind and place ("audio 2 of 2: ..."), a lone item not at all."""
    if not isinstance(exc, MediaError):
        return
    files = {"image": list(args.image), "video": [args.video] if args.video else [], "audio": list(args.audio)}
    item = _ITEM.fullmatch(getattr(exc, "named", ""))
    if item:
        kind, i = item.group(1), int(item.group(2))
        if i <= len(files[kind]):
            exc.args = (f"--{kind} {files[kind][i - 1]}: {exc.unnamed}",)
        return
    named = [(k, f) for k, fs in files.items() for f in fs] + ([("pdf", args.pdf)] if args.pdf else [])
    if len(named) == 1 and not hasattr(exc, "named"):  # not yet named: the checks before the load name theirs
        exc.args = (f"--{named[0][0]} {named[0][1]}: {exc}",)


def check_generation_flags(args) -> None:
    """The sampling flags (not request options: vl/runtime/sampling.py)."""
    if not 0.0 <= args.temperature <= 2.0:
        raise GenerationOptionError(f"--temperature must be between 0 and 2, found {args.temperature}")


def media_content(args) -> list[dict]:
    """The message parts for the media flags, in the order images, PDF, video, audio."""
    content = [{"type": "image", "image": f} for f in args.image]
    if args.pdf:
        content.append({"type": "pdf", "pdf": args.pdf})
    if args.video:
        content.append({"type": "video", "video": args.video})
    content += [{"type": "audio", "audio": f} for f in args.audio]
    return content
