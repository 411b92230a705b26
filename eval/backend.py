"""Where the eval runner's generations come from: `vl.Engine` in this process, or in a worker process.

The runner only needs "conversations in, generations out" (nanochat's engine/mock split): a backend has
`generate(conversations, settings) -> list[Generation]` and raises when any conversation fails, and
`close()`. `EngineBackend` drives `vl.Engine` (greedy `chat` for one conversation, `chat_batch` for
several). `ProcessBackend` runs any backend in a child process, so an item that hangs or kills its
process (a decoder segfault, the OOM killer) costs that item and a worker restart, never the run
(docs/reliability_policy.md §5 "Isolation", row E8). The child is a plain `python -c` process (like
vl/processing/sandbox.py) that never re-imports the caller's `__main__`, and it exits when its parent
dies, so a SIGKILLed runner leaves no model process behind.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from vl.errors import VLError
from vl.options import RequestOptions, names, with_option_fields
from vl.processing.sandbox import exit_text


class ItemTimeoutError(VLError):
    """An item ran past the per-item timeout; its worker was stopped (row E8)."""

    code = "timeout"
    http_status = 504


class WorkerCrashedError(VLError):
    """The generation worker process died (signal, OOM killer); it is restarted for the next item."""

    code = "worker_crashed"


class TransientError(VLError):
    """A failure expected to go away on retry (e.g. a flaky file system); retried with backoff (row E4)."""

    code = "transient"


# the per-request options an eval run sets: those marked `eval` in vl/options.py (fields, `--sweep` keys, flags)
EVAL_OPTIONS = names(eval=True)


@dataclass(frozen=True)
@with_option_fields(EVAL_OPTIONS, {"thinking": False})
class GenerationSettings:
    """Everything per call that changes what the model sees or says (all of it is in the run fingerprint): the
    request options of vl/options.py marked `eval` (one field each, added by `with_option_fields`; `thinking`
    False: /no_think, the primary LE configuration, docs/eval_scoring.md §0), the seed and the soft timeout."""

    max_new_tokens: int
    seed: int = 0
    timeout_s: float | None = None  # soft per-item limit inside the engine (stops decoding cleanly)

    def options(self) -> RequestOptions:
        return RequestOptions.from_kwargs(**{n: getattr(self, n) for n in EVAL_OPTIONS})

    def chat_kwargs(self) -> dict:
        """Greedy decoding plus the options, as keywords of `vl.Engine.chat` (or `RemoteEngine.chat`)."""
        return {"temperature": 0.0, **{n: getattr(self, n) for n in EVAL_OPTIONS}}


@dataclass
class Generation:
    """One conversation's outcome, reduced to what a predictions record keeps."""

    text: str  # the raw completion (reasoning, `</think>`, answer); the task post-processes it
    finish_reason: str  # "stop" | "length" | "stop_string" | "timeout" | ...
    reasoning_truncated: bool = False
    prompt_tokens: int = 0
    vision_tokens_before: int = 0
    vision_tokens_after: int = 0
    new_tokens: int = 0
    notes: list[str] = field(default_factory=list)
    time_to_first_token_s: float | None = None
    audio_tokens: int | None = 0  # audio placeholder tokens the model saw; None: a server that does not report it


class EngineBackend:
    """`vl.Engine` in this process. `device`: None/"cpu", "cuda", "cuda:N" or "auto" (a `device_map`)."""

    def __init__(self, model: str, dtype: str | None = None, device: str | None = None,
                 decode_sandbox: bool = True, engine=None):
        if engine is None:
            from vl.runtime.engine import Engine

            engine = Engine.from_pretrained(model, dtype=dtype, device_map=None if device in (None, "cpu") else device,
                                            isolate=decode_sandbox)
        self.engine = engine

    def info(self) -> dict:
        cfg = self.engine.model.config
        param = next(self.engine.model.parameters())
        return {"dtype": str(param.dtype).replace("torch.", ""), "device": str(param.device),
                "max_num_tiles": getattr(cfg, "max_num_tiles", None),
                "video_pruning_rate": getattr(cfg, "video_pruning_rate", None)}

    def generate(self, conversations: list, settings: GenerationSettings) -> list[Generation]:
        import torch

        torch.manual_seed(settings.seed)
        options = settings.options()
        if len(conversations) == 1:
            results = [self.engine.chat(conversations[0], options, temperature=0.0, timeout_s=settings.timeout_s)]
        else:
            results = self.engine.chat_batch(conversations, options, temperature=0.0)
        return [Generation(r.text, r.finish_reason, bool(r.reasoning_truncated), r.stats.prompt_tokens,
                           r.stats.vision_tokens_before, r.stats.vision_tokens_after, r.stats.new_tokens,
                           list(r.stats.notes), r.stats.time_to_first_token_s, r.stats.audio_tokens) for r in results]

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------
# process isolation

_BOOT = ("import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
         "from eval.backend import _worker_main; _worker_main(int(sys.argv[2]))")


def make_engine_backend(**kwargs) -> EngineBackend:
    """Factory run inside the worker (module-level, so it is importable by name)."""
    return EngineBackend(**kwargs)


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


class ProcessBackend:
    """Runs `factory(**factory_kwargs)` (a "module:function" returning a backend) in a child process.

    Each `generate` call waits at most `item_timeout_s` x len(conversations) + `grace_s`; past that the
    worker is killed and `ItemTimeoutError` raised (the runner then retries a batch item by item, so the
    item that hangs is the one recorded as `timeout`). A worker that dies raises `WorkerCrashedError`.
    Either way the next call starts a fresh worker (the model is loaded again).
    """

    def __init__(self, factory: str = "eval.backend:make_engine_backend", factory_kwargs: dict | None = None,
                 item_timeout_s: float | None = None, grace_s: float = 30.0, load_timeout_s: float = 3600.0,
                 env: dict | None = None):
        self.factory, self.factory_kwargs = factory, dict(factory_kwargs or {})
        self.item_timeout_s, self.grace_s, self.load_timeout_s = item_timeout_s, grace_s, load_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.restarts = 0
        self._info: dict | None = None
        self._started_once = False

    # --- worker lifetime -------------------------------------------------------------------------
    def _start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        paths = [p for p in sys.path if p]
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(paths), str(child_sock.fileno())],
                                         pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=_stderr_fd(), env={**os.environ, **(self.env or {})})
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        self._send(("init", self.factory, self.factory_kwargs))
        status, value = self._receive(self.load_timeout_s, "loading the model")
        if status != "ok":
            self._kill()
            raise value
        self._info = value

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None

    def _send(self, message) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the worker is gone; _receive reports how

    def _receive(self, timeout: float | None, what: str):
        start = time.monotonic()
        try:
            ready = self.conn.poll(timeout)
        except (OSError, EOFError):
            ready = True
        if not ready:
            self._kill()
            raise ItemTimeoutError(f"{what} did not finish within {timeout:.1f} s; the worker was stopped and "
                                   "will be restarted for the next item")
        try:
            data = self.conn.recv_bytes()
        except (EOFError, ConnectionResetError, OSError):
            code = self.proc.wait() if self.proc is not None else None
            self._kill()
            raise WorkerCrashedError(f"the generation worker died ({exit_text(code)}) after "
                                     f"{time.monotonic() - start:.1f} s while {what}; it is restarted for the "
                                     "next item") from None
        try:
            status, value = pickle.loads(data)
        except Exception as e:  # noqa: BLE001 - e.g. an exception class that cannot be rebuilt here
            return "err", VLError(f"the generation worker sent an unreadable reply while {what}: {e!r}")
        if status == "fail":
            self._kill()
            raise WorkerCrashedError(f"the generation worker failed while {what}: {value}")
        return status, value

    def info(self) -> dict:
        if self.proc is None:
            self._start()
        return dict(self._info or {})

    def generate(self, conversations: list, settings: GenerationSettings) -> list[Generation]:
        if self.proc is None or self.proc.poll() is not None:
            self._kill()
            self._start()
        self._send(("generate", conversations, settings))
        timeout = None if self.item_timeout_s is None else self.item_timeout_s * len(conversations) + self.grace_s
        what = f"generating {len(conversations)} item(s)"
        status, value = self._receive(timeout, what)
        if status == "err":
            raise value
        return value

    def close(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.poll() is None:
            self._send(("exit",))
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._kill()


def _stderr_fd() -> int:
    """The worker prints to our stderr (stdout stays clean for the summary), even when sys.stderr is replaced."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


def _worker_main(fd: int) -> None:
    parent = os.getppid()

    def watchdog():  # a busy worker notices its parent's death by being re-parented
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True, name="vl-eval-watchdog").start()
    conn = Connection(fd)
    backend: Any = None
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "exit":
            return
        try:
            if kind == "init":
                backend = _resolve(message[1])(**message[2])
                info = backend.info() if hasattr(backend, "info") else {}
                reply = ("ok", info)
            else:
                reply = ("ok", backend.generate(message[1], message[2]))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the runner, typed
            reply = ("err", e)
        except BaseException as e:  # noqa: BLE001
            reply = ("fail", repr(e))
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - an exception that cannot be pickled: send its text
            data = pickle.dumps(("err", VLError(f"{type(reply[1]).__name__}: {reply[1]} ({e})")))
        try:
            conn.send_bytes(data)
        except OSError:
            return
        if reply[0] == "fail":
            return
