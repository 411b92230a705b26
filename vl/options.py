"""`RequestOptions`: every per-request option, declared once (docs/architecture.md, "Options").

One frozen dataclass holds what one request asks for: media options (read by the processor), token-reduction
options (read by the model's reducers) and generation options (read by the decode loop). Each field carries its
metadata -- type, default, bounds, one help text, its CLI flag, its OpenAI-request key (vLLM's spellings such as
`mm_processor_kwargs.max_num_tiles` where vLLM has one), other names it is known by, and where it acts. The front
ends derive what they accept from here instead of keeping their own lists: `vl chat` / `vl eval` flags
(vl/cli/flags.py), the server's body parsing (vl/server/request.py) and `RemoteEngine`'s request body
(vl/server/client.py), the pipeline's keywords (vl/hf/processor.py), the eval run config and sweep keys (eval/), and the
app's bounds (ui/). The record is built once at the edge, validated in `__post_init__` (one validator per option,
one range), and handed down unchanged to `vl.Engine` and the processor.

Adding an option = one field here + the code where it acts (+ a test); gpt-fast's `ModelArgs` and vLLM's
`SamplingParams` are the shape followed (a typed record, checked when built, never a loose dict).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vl.errors import GenerationOptionError, InputError

PROCESSOR, REDUCTION, GENERATION = "processor", "reduction", "generation"
ACTS = (PROCESSOR, REDUCTION, GENERATION)


@dataclass(frozen=True)
class Spec:
    """How one option is typed, bounded, named and exposed."""

    kind: type  # int | float | bool | str | dict (chat template variables: `check_template_vars`)
    acts: str  # where it acts: PROCESSOR (media), REDUCTION (token reduction), GENERATION (decoding)
    help: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself is refused
    hi_open: bool = False  # hi itself is refused
    nullable: bool = False  # None is a value ("the model's default", "no budget")
    flag: str | None = None  # the CLI flag; None: not a flag
    metavar: str | None = None
    aliases: tuple[str, ...] = ()  # other names accepted as keywords, sweep keys and request keys
    openai: str | None = None  # where an OpenAI request body carries it ("a.b": key b of object a); None: not sent
    openai_read: tuple[str, ...] = ()  # where a request body may carry it, first found wins (default: `openai`)
    pipeline: bool = False  # a keyword of the transformers pipeline / apply_chat_template
    eval: bool = False  # a setting of eval runs (RunConfig field, `--sweep` key, run fingerprint)
    name: str = ""  # filled in from the field

    def range_text(self) -> str:
        """The accepted range as error messages write it: "1..12", ">= 0", "in [0, 1)"."""
        if self.kind is int and not (self.lo_open or self.hi_open):
            if self.hi is None:
                return "a positive integer" if self.lo == 1 else f"an integer >= {self.lo:g}"
            return f"{self.lo:g}..{self.hi:g}"
        lo = "(-inf" if self.lo is None else ("(" if self.lo_open else "[") + f"{self.lo:g}"
        hi = "inf)" if self.hi is None else f"{self.hi:g}" + (")" if self.hi_open else "]")
        return f"in {lo}, {hi}"

    def check(self, value, label: str | None = None):
        """The one validator of this option: the value normalised (an int given for a float becomes a float),
        or GenerationOptionError saying what was expected and what was found."""
        label = label or self.name
        if value is None:
            if self.nullable:
                return None
            raise GenerationOptionError(f"{label} needs a value ({self.help}); found None")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise GenerationOptionError(f"{label} must be true or false, found {value!r}")
            return value
        if self.kind is dict:
            return check_template_vars(value, label)
        if self.kind is str:
            if not isinstance(value, str):
                raise GenerationOptionError(f"{label} must be a string, found {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                self.kind is int and not (isinstance(value, int) or float(value).is_integer())):
            what = "an integer" if self.kind is int else "a number"
            raise GenerationOptionError(f"{label} must be {what}, found {value!r}")
        try:
            value = self.kind(value)
        except OverflowError:  # an integer too large for a float (10**400): out of every range
            raise GenerationOptionError(f"{label} must be {self.range_text() or 'a finite number'}, found an "
                                        f"integer of {len(str(abs(value)))} digits") from None
        if self.kind is float and not math.isfinite(value):
            raise GenerationOptionError(f"{label} must be a finite number, found {value!r}")
        low = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if low or high:
            raise GenerationOptionError(f"{label} must be {self.range_text()}, found {value!r}")
        return value


# Variables a chat template is rendered with that a request cannot set: the ones the renderer passes itself
# (vl/processing/chat.py `render_prompt`; the reasoning mode is the `thinking` option), the tokenizer's special
# tokens, and the functions transformers and Jinja put in scope.
RESERVED_TEMPLATE_VARS = frozenset({
    "messages", "add_generation_prompt", "continue_final_message", "enable_thinking", "tools", "documents",
    "chat_template", "tokenize", "return_dict", "return_tensors", "padding", "truncation", "max_length",
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens", "raise_exception", "strftime_now", "range", "dict", "lipsum", "cycler", "joiner",
    "namespace", "loop", "self", "true", "false", "none", "True", "False", "None"})
MAX_TEMPLATE_VARS, MAX_TEMPLATE_TEXT = 32, 4096
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_template_vars(value, label: str) -> dict:
    """Extra variables for the model's chat template (vLLM's and SGLang's `chat_template_kwargs`; transformers'
    extra `apply_chat_template` keywords): a copy of `value`, or GenerationOptionError. Names are identifiers
    outside `RESERVED_TEMPLATE_VARS`; values are JSON scalars (true/false, numbers, strings of at most
    MAX_TEMPLATE_TEXT characters, null), which is what the released templates read (`truncate_history_thinking`,
    `low_effort`, `reasoning_budget`). Whether the template reads a name is decided when it renders."""
    if not isinstance(value, Mapping):
        raise GenerationOptionError(f"{label} must be an object of template variables, found {_short(value)}")
    if len(value) > MAX_TEMPLATE_VARS:
        raise GenerationOptionError(f"{label} holds {len(value)} variables; at most {MAX_TEMPLATE_VARS}")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            raise GenerationOptionError(f"{label}: {_short(key)} is not a template variable name (letters, digits "
                                        "and _, at most 64, not starting with a digit)")
        if key in RESERVED_TEMPLATE_VARS:
            hint = " (the reasoning mode is its own option: enable_thinking / thinking)" if key == "enable_thinking" \
                else ""
            raise GenerationOptionError(f"{label}: {key!r} is set by the renderer, not by a request{hint}")
        if not _template_scalar(item):
            raise GenerationOptionError(f"{label}.{key} must be true/false, a finite number, a string of at most "
                                        f"{MAX_TEMPLATE_TEXT} characters or null, found {_short(item)}")
        out[key] = item
    return out


def _template_scalar(item) -> bool:
    if item is None or isinstance(item, bool):
        return True
    if isinstance(item, str):
        return len(item) <= MAX_TEMPLATE_TEXT
    if isinstance(item, int):
        return abs(item) < 2 ** 63
    return isinstance(item, float) and math.isfinite(item)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _option(default, **spec):
    return field(default=default, metadata={"spec": Spec(**spec)})


# What an unset `thinking` resolves to when no message carries /think or /no_think: off (see the option).
DEFAULT_THINKING = False


@dataclass(frozen=True)
class RequestOptions:
    """One request's options. Build it with keywords (aliases accepted: `from_kwargs`), from an OpenAI body
    (`from_openai`) or from parsed CLI flags (vl/cli/flags.py); it is checked when built."""

    # --- media: read by the processor (vl/processing/processor.py), docs/app_and_cli.md ---------------------
    max_num_tiles: int | None = _option(
        None, kind=int, acts=PROCESSOR, lo=1, hi=12, nullable=True, flag="--max-tiles", metavar="N",
        aliases=("max_tiles",), openai="mm_processor_kwargs.max_num_tiles", pipeline=True, eval=True,
        help="at most N tiles per image or page (a tile is the model's tile size: 512 px for Nano V2 VL), 1..12, "
             "vLLM's per-request range (default: the checkpoint's max_num_tiles)")
    fps: float = _option(
        2.0, kind=float, acts=PROCESSOR, lo=0.0, lo_open=True, hi=30.0, flag="--fps", metavar="F",
        openai="mm_processor_kwargs.fps", pipeline=True, eval=True,
        help="video frames sampled per second, in (0, 30] (default 2)")
    max_frames: int = _option(
        128, kind=int, acts=PROCESSOR, lo=1, hi=512, flag="--max-frames", metavar="N",
        openai="mm_processor_kwargs.max_frames", pipeline=True, eval=True,
        help="at most N video frames, 1..512 (default 128)")
    pages: str | None = _option(
        None, kind=str, acts=PROCESSOR, nullable=True, flag="--pages", metavar="RANGE",
        openai="mm_processor_kwargs.pages", pipeline=True,
        help='pages of the PDF, e.g. "1-3,7" (default: all)')
    max_pages: int | None = _option(
        None, kind=int, acts=PROCESSOR, lo=1, nullable=True, flag="--max-pages", metavar="N",
        openai="mm_processor_kwargs.max_pages", pipeline=True, eval=True,
        help="render at most N pages of a PDF in this request (a page range selects which); it can only lower "
             "the processor's own cap (default: that cap)")
    skip_blank_tiles: bool = _option(
        False, kind=bool, acts=PROCESSOR, flag="--skip-blank-tiles", openai="skip_blank_tiles", pipeline=True,
        eval=True, help="drop blank (whitespace) tiles of images and pages before the vision encoder")
    use_audio_in_video: bool | None = _option(
        None, kind=bool, acts=PROCESSOR, nullable=True, flag="--with-audio", aliases=("with_audio",),
        openai="mm_processor_kwargs.use_audio_in_video", pipeline=True, eval=True,
        help="hear a video's sound track with its frames (models with an audio encoder, such as Nemotron 3 Nano "
             "Omni); default: on when the model hears (asked of one that does not, a note says so)")
    pdf_scale: float | None = _option(
        None, kind=float, acts=PROCESSOR, lo=0.0, lo_open=True, hi=16.0, nullable=True, pipeline=True,
        help="PDF render scale, 2.0 = 144 dpi (default: the processor's)")
    context_length: int | None = _option(
        None, kind=int, acts=PROCESSOR, lo=1, nullable=True,
        help="tokens the processor plans a document's tiles for (default: the model's context)")
    reserved_tokens: int | None = _option(
        None, kind=int, acts=PROCESSOR, lo=0, nullable=True,
        help="tokens kept free for the question and the answer when a document is planned (default 1024)")
    template_kwargs: dict | None = _option(
        None, kind=dict, acts=PROCESSOR, nullable=True, aliases=("chat_template_kwargs",), flag="--template-var",
        metavar="NAME=VALUE", openai="chat_template_kwargs", pipeline=True,
        help='extra variables for the model\'s chat template, e.g. {"truncate_history_thinking": false}; names '
             "its template does not read are ignored and logged (as vLLM does)")
    # --- token reduction: read by the model (vl/modeling/vlm.py), docs/token_reduction.md ------------------
    video_pruning_rate: float | None = _option(
        None, kind=float, acts=REDUCTION, lo=0.0, hi=1.0, hi_open=True, nullable=True, flag="--video-pruning-rate",
        metavar="Q", aliases=("evs",), openai="video_pruning_rate", pipeline=True, eval=True,
        help="EVS: fraction of video tokens removed as repeats of the previous frame, in [0, 1) "
             "(default: the checkpoint's)")
    token_pruning_rate: float = _option(
        0.0, kind=float, acts=REDUCTION, lo=0.0, hi=1.0, hi_open=True, flag="--token-pruning-rate", metavar="Q",
        openai="token_pruning_rate", pipeline=True, eval=True,
        help="fraction of document vision tokens removed as redundant background, in [0, 1) (default 0)")
    # --- generation: read by the decode loop (vl/runtime/batch.py, vl/runtime/decode_batch.py) -----------------
    max_new_tokens: int = _option(
        256, kind=int, acts=GENERATION, lo=1, flag="--max-new-tokens", metavar="N",
        openai="max_tokens", openai_read=("max_completion_tokens", "max_tokens"), eval=True,
        help="stop after N new tokens, reasoning included (default 256)")
    # Reasoning is off unless asked for, in every front end (the app, `vl chat`, the pipeline, `Engine.chat`, eval,
    # the server): with it on, a small token limit often ends inside the reasoning with no answer. Asked for means
    # this option (True / False), or else a /think or /no_think in a system or user message (the model card's
    # way); with neither, `DEFAULT_THINKING` (vl/processing/chat.py `render_prompt` applies it).
    thinking: bool | None = _option(
        None, kind=bool, acts=GENERATION, nullable=True, flag="--thinking", aliases=("enable_thinking",),
        openai="chat_template_kwargs.enable_thinking", openai_read=("chat_template_kwargs.enable_thinking", "thinking"),
        pipeline=True, eval=True,
        help="reasoning before the answer (/think) or not (/no_think); default: a /think or /no_think in the "
             "messages, else off")
    reasoning_budget: int | None = _option(
        None, kind=int, acts=GENERATION, lo=0, nullable=True, flag="--reasoning-budget", metavar="N",
        openai="reasoning_budget", help="close the think block after N tokens (default: no budget)")
    ignore_eos: bool = _option(
        False, kind=bool, acts=GENERATION, flag="--ignore-eos", openai="ignore_eos",
        help="keep generating after the end-of-sequence token (vLLM's ignore_eos): the answer ends at "
             "max_new_tokens or a stop string, for benchmarks of a fixed answer length")
    min_tokens: int = _option(
        0, kind=int, acts=GENERATION, lo=0, flag="--min-tokens", metavar="N", openai="min_tokens",
        help="the end-of-sequence tokens cannot come before N new tokens, and stop strings are not looked for "
             "before then (vLLM's min_tokens; default 0)")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, spec(f.name).check(getattr(self, f.name)))
        if self.min_tokens > self.max_new_tokens:  # vLLM refuses it too: the budget would end the answer first
            raise GenerationOptionError(f"min_tokens={self.min_tokens} is above max_new_tokens (max_tokens)="
                                        f"{self.max_new_tokens}; lower min_tokens or raise max_new_tokens")

    # --- building ------------------------------------------------------------------------------------------
    @classmethod
    def from_kwargs(cls, base: "RequestOptions | None" = None, **kwargs) -> "RequestOptions":
        """Options from keywords (canonical names or declared aliases) over `base` (default: the defaults).
        An unknown keyword is refused with the known names; a name given twice (under an alias) too."""
        unknown = sorted(k for k in kwargs if canonical(k) is None)
        if unknown:
            raise GenerationOptionError(f"unknown option(s) {unknown}; per-request options: {', '.join(names())} "
                                        f"(sampling: temperature, top_p, top_k, repetition_penalty, seed)")
        given = {}
        for key, value in kwargs.items():
            name = canonical(key)
            if name in given:
                raise GenerationOptionError(f"{name} is given twice (as {key!r} too); pass it once")
            given[name] = value
        return dataclasses.replace(base or cls(), **given)

    @classmethod
    def from_openai(cls, body: Mapping, base: "RequestOptions | None" = None) -> "RequestOptions":
        """Options from an OpenAI Chat Completions body, at the keys declared in each field's `openai` (vLLM's
        extensions and ours). Objects that carry options (`mm_processor_kwargs`, ...) must hold only known keys."""
        given, known = {}, {}
        whole = {s.openai for s in specs() if s.kind is dict}  # objects read as a whole (chat_template_kwargs)
        claimed = {p for s in specs() for p in s.openai_read or (s.openai,) if p}  # "a.b": another option's key
        for s in specs():
            for path in s.openai_read or ((s.openai,) if s.openai else ()):
                head, _, key = path.rpartition(".")
                known.setdefault(head, set()).add(key)
                obj = body.get(head) if head else body
                if head and obj is not None and not isinstance(obj, Mapping):
                    raise InputError(f"{head} must be an object, found {type(obj).__name__}")
                if obj and key in obj and obj[key] is not None and s.name not in given:
                    value = obj[key]
                    if s.kind is dict and isinstance(value, Mapping):  # less the keys another option reads there
                        value = {k: v for k, v in value.items() if f"{path}.{k}" not in claimed}
                    empty = s.kind is dict and isinstance(value, Mapping) and not value  # only enable_thinking
                    given[s.name] = None if empty else s.check(value, path)
        for head, keys in known.items():
            obj = body.get(head) if head else None
            unknown = sorted(set(obj or ()) - keys) if head and head not in whole else []
            if unknown:
                raise GenerationOptionError(f"{head} {unknown} are not supported; known: {', '.join(sorted(keys))}")
        return dataclasses.replace(base or cls(), **given)

    # --- handing down ----------------------------------------------------------------------------------------
    def acting(self, acts: str) -> dict:
        """The options that act at `acts`, None values left out (the receiver's own default then applies)."""
        return {s.name: getattr(self, s.name) for s in specs() if s.acts == acts and getattr(self, s.name) is not None}

    def processor_kwargs(self) -> dict:
        """`vl.processing.Processor.__call__` keywords."""
        return self.acting(PROCESSOR)

    def to_openai(self) -> dict:
        """The OpenAI body fields for these options; only values that differ from the defaults are sent, so a
        server that does not know one of our extensions is not sent it needlessly."""
        body: dict = {}
        default = RequestOptions()
        for s in specs():
            value = getattr(self, s.name)
            always = s.name == "max_new_tokens"  # every OpenAI server needs the budget; its own default differs
            if s.openai is None or value is None or (value == getattr(default, s.name) and not always):
                continue
            head, _, key = s.openai.rpartition(".")
            if s.kind is dict:  # merged with the keys other options put in the same object (enable_thinking)
                body.setdefault(key, {}).update(value)
            else:
                (body.setdefault(head, {}) if head else body)[key] = value
        return body

    def replace(self, **kwargs) -> "RequestOptions":
        return RequestOptions.from_kwargs(self, **kwargs)


def with_option_fields(option_names, defaults: dict | None = None):
    """Class decorator (put it under `@dataclass`): one field per option in `option_names` that the class does
    not declare itself, typed and defaulted as `RequestOptions` declares it (or as `defaults` says), after the
    class's own fields. A run configuration that takes options this way gets a new option by itself."""
    defaults = defaults or {}

    def add(cls):
        notes = cls.__dict__.get("__annotations__", {})
        own = {f.name: f for f in dataclasses.fields(RequestOptions)}
        for name in option_names:
            if name in notes:
                continue
            notes[name] = own[name].type
            setattr(cls, name, defaults.get(name, own[name].default))
        cls.__annotations__ = notes
        return cls

    return add


def specs() -> tuple[Spec, ...]:
    return _SPECS


def spec(name: str) -> Spec:
    return _BY_NAME[name]


def names(**where) -> tuple[str, ...]:
    """Canonical option names whose spec matches every `attribute=value` given (e.g. `acts=PROCESSOR`)."""
    return tuple(s.name for s in _SPECS if all(getattr(s, k) == v for k, v in where.items()))


def canonical(key: str) -> str | None:
    """The option's canonical name for a name or an alias (`max_tiles` -> `max_num_tiles`); None if unknown."""
    return _ALIAS.get(key)


def option_aliases() -> dict[str, str]:
    """Every accepted name (canonical names and aliases) -> the canonical name."""
    return dict(_ALIAS)


def _collect():
    out = []
    for f in dataclasses.fields(RequestOptions):
        out.append(dataclasses.replace(f.metadata["spec"], name=f.name))
    return tuple(out)


_SPECS = _collect()
_BY_NAME = {s.name: s for s in _SPECS}
_ALIAS = {**{s.name: s.name for s in _SPECS}, **{a: s.name for s in _SPECS for a in s.aliases}}
