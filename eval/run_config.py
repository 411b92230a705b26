"""One eval run's settings (`RunConfig`): the task, data, output folder and model or server, the request options
an eval sets (vl/options.py, declared once for every front end), retries, timeouts and isolation, each checked
when the config is made, so a bad option is a typed error (`bad_option`) before any item runs; and the settings
the items actually run with (`effective_settings`), which name what the task or checkpoint decided."""

from __future__ import annotations

from dataclasses import dataclass

from eval.backend import EVAL_OPTIONS, GenerationSettings
from eval.tasks import Task
from vl.errors import GenerationOptionError, InputError
from vl.options import spec, with_option_fields

ISOLATION = ("process", "inline")
BACKENDS = ("local", "openai")


class RunOptionError(InputError):
    code = "bad_option"


@dataclass(frozen=True)
@with_option_fields(EVAL_OPTIONS, {"thinking": False, "max_new_tokens": None})
class RunConfig:
    """One eval run. The request options an eval sets (vl/options.py, those marked `eval`: max_num_tiles, fps,
    max_frames, video_pruning_rate, skip_blank_tiles, token_pruning_rate, max_new_tokens, thinking, ...) are
    fields too, added after these by `with_option_fields` and checked by the record's validators;
    `max_new_tokens` None = the task's harness budget, `max_num_tiles` / `video_pruning_rate` None = the
    checkpoint's, `thinking` False = /no_think (docs/eval_scoring.md §0: primary runs)."""

    task: str
    data: str
    out: str
    model: str | None = None
    split: str | None = None
    media_root: str | None = None
    limit: int | None = None
    batch_size: int = 1
    seed: int = 0
    dtype: str | None = None
    device: str | None = None  # None/"auto": cuda:LOCAL_RANK when CUDA is there, else cpu
    retries: int = 2  # in-run retries of a transient failure
    backoff_s: float = 1.0  # first retry delay; doubles each time
    max_attempts: int = 3  # runs (this one included) that may redo a retriable failure
    item_timeout_s: float | None = None
    isolation: str = "process"  # "process": model in a worker process; "inline": in this process
    decode_sandbox: bool = True  # media decoding in killable subprocesses (vl/processing/sandbox.py)
    resume: bool = False
    progress: bool = True
    backend: str = "local"  # "local": vl.Engine here; "openai": an OpenAI-compatible server (eval/remote_backend.py)
    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None  # None: the one model the server lists
    concurrency: int = 4  # requests in flight at once against a server
    read_timeout_s: float = 600.0  # the longest silence from a server before the item is recorded `unavailable`
    max_connection_failures: int = 3  # items in a row the server did not answer before the run stops; 0: never

    def __post_init__(self):
        for name in EVAL_OPTIONS:  # the record's one validator per option; None where this config allows it
            value = getattr(self, name)
            if value is None and getattr(RunConfig, name) is None:
                continue
            try:
                object.__setattr__(self, name, spec(name).check(value))
            except GenerationOptionError as e:
                raise RunOptionError(str(e)) from None
        checks = [
            (self.batch_size >= 1, "batch_size", "an integer >= 1"),
            (self.limit is None or self.limit >= 1, "limit", "an integer >= 1"),
            (self.retries >= 0, "retries", "an integer >= 0"),
            (self.backoff_s >= 0, "backoff_s", "seconds >= 0"),
            (self.max_attempts >= 1, "max_attempts", "an integer >= 1"),
            (self.item_timeout_s is None or self.item_timeout_s > 0, "item_timeout_s", "seconds > 0"),
            (self.isolation in ISOLATION, "isolation", f"one of {ISOLATION}"),
            (isinstance(self.thinking, bool), "thinking", "True (/think) or False (/no_think)"),
            (self.backend in BACKENDS, "backend", f"one of {BACKENDS}"),
            (self.backend != "openai" or bool(self.base_url), "base_url", "a server URL with --backend openai"),
            (self.concurrency >= 1, "concurrency", "an integer >= 1"),
            (self.read_timeout_s > 0, "read_timeout_s", "seconds > 0"),
            (self.max_connection_failures >= 0, "max_connection_failures", "an integer >= 0 (0: never stop)"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise RunOptionError(f"{name}={getattr(self, name)!r}: expected {expected}")


def effective_settings(cfg: RunConfig, task: Task, facts: dict) -> GenerationSettings:
    """The settings the items run with: the config's options, where it leaves one to the task (max_new_tokens)
    or to the checkpoint (max_num_tiles, video_pruning_rate: the model facts), that value, so the fingerprint
    and the header name what actually ran."""
    chosen = {name: getattr(cfg, name) for name in EVAL_OPTIONS}
    chosen["max_new_tokens"] = cfg.max_new_tokens or task.max_new_tokens
    for name in ("max_num_tiles", "video_pruning_rate"):
        if chosen[name] is None:
            chosen[name] = facts.get(name)
    return GenerationSettings(**chosen, seed=cfg.seed, timeout_s=cfg.item_timeout_s)
