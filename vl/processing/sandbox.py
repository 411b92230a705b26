"""Run a decode step in a killable worker process with a wall-clock timeout and a memory cap.

Why (docs/reliability_policy.md §0 rule 5, §1.3, §1.4): decord aborts or segfaults the interpreter on bad streams,
PDFium has a history of segfaults, and Pillow's maintainers put "sandboxed subprocess" first. A crash or a
hang in a worker must become one typed error for that request while the server keeps serving.

Design:
- Workers are plain `python -c ...` subprocesses (not `multiprocessing`), so they never re-import the
  caller's `__main__` (which may load a model); they import only the module of the function they run.
  The caller's `sys.path` is handed over so test helpers and editable installs import the same way.
- Parent and worker talk over one socketpair with `multiprocessing.connection` framing (pickle).
- A worker loads the decoder libraries (`_PRELOAD`) when it starts, before any cap, then says it is ready with
  its thread count and resident memory (its baseline). Boot time does not count against a call's timeout.
- Memory is capped two ways, neither of which breaks mapping a shared library: each call sets the worker's
  RLIMIT_DATA (heap, anonymous maps, thread stacks; not file-backed code) to `memory_mb`, and the parent polls
  the worker's resident set (/proc/<pid>/status) while it waits and kills it above `memory_mb`. Either way the
  call fails with `MediaTooLargeError` and the worker is replaced. RLIMIT_AS (address space) is not used: it
  counts every mapped library and reserved-but-unused region, so `dlopen` and FFmpeg's allocations failed
  under it and came back as ordinary errors from a poisoned worker.
- A worker that dies (SIGKILL, SIGSEGV, abort) gives `DecoderCrashedError`; one that does not answer within
  `timeout` is killed and gives `DecodeTimeoutError`. Either way it is discarded and the next call starts a
  fresh one (respawn is lazy: no process is started until it is needed).
- A worker is kept for the next call only when the call ended with a result or with a typed `MediaError` (the
  decoder's verdict on the file) and the worker is back near its baseline: after each call it collects garbage,
  returns freed heap to the system and reports its threads and resident memory; more than `_THREAD_SLACK`
  threads or `_RSS_SLACK_MB` above the baseline and it is replaced. Any other failure (an `OSError` from
  `dlopen`, an `ImportError`, a `MemoryError`, an untyped exception) is not the file's fault, and the worker that
  raised it is replaced, so it cannot fail the next file.
- A stop asked for while waiting (the current request's `vl.processing.progress.Work`) kills the worker at
  once and raises `StoppedError`: a stopped request's decode does not run on to its end.
- When that `Work` is watched, the function runs in the worker under a `Work` whose reports (e.g. "video frames
  decoded" i/n) are sent to the parent as they happen and passed on to the caller's `Work` (which is also a
  stop point: a stop asked for by the watcher kills the worker). Reports do not extend the timeout.
- Idle workers are pooled (at most `os.cpu_count()` of them) and reused, so sequential calls do not leak fds.
"""

import atexit
import ctypes
import ctypes.util
import gc
import importlib
import json
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from multiprocessing.connection import Connection

from vl.errors import DecoderCrashedError, DecodeTimeoutError, MediaError, MediaTooLargeError, StoppedError
from vl.processing.progress import Work

__all__ = ["run_isolated", "shutdown_workers", "worker_count"]

_BOOT = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
    "from vl.processing.sandbox import _worker_main; _worker_main(int(sys.argv[2]))"
)
# the decoders' libraries, loaded (dlopen) when a worker starts, before any memory cap; absent ones are skipped
_PRELOAD = ("numpy", "PIL.Image", "av", "decord", "pypdfium2")
_THREAD_SLACK = 4  # threads a worker may keep above its baseline after a call and still be reused
_RSS_SLACK_MB = 256  # resident memory (MB) a worker may keep above its baseline after a call and still be reused
_BOOT_TIMEOUT_S = 120.0  # for a worker to load _PRELOAD (seconds on a loaded machine)
_POLL_S = 0.1  # how often the parent looks at a busy worker's memory and at a stop


class _Worker:
    def __init__(self):
        parent_sock, child_sock = socket.socketpair()
        paths = [p for p in sys.path if p]

        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(paths), str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                # glibc reserves 64 MiB per thread arena, and OpenBLAS starts a thread per core when numpy is
                # imported; neither is of use to a decoder, both grow the worker with the core count
                env={**os.environ, "MALLOC_ARENA_MAX": "2", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.calls = 0
        self.baseline: dict | None = None  # {"threads", "rss"} once the worker said it is ready

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()

    def signal_name(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return exit_text(code)

    def rss(self) -> int | None:
        return _proc_status(self.proc.pid).get("rss")

    def reusable(self, stats: dict | None) -> bool:
        """Whether a worker that reported `stats` after a call is back near its baseline."""
        if not stats or not self.baseline:
            return True  # no /proc here: nothing to compare
        return (stats["threads"] <= self.baseline["threads"] + _THREAD_SLACK
                and stats["rss"] <= self.baseline["rss"] + (_RSS_SLACK_MB << 20))


def exit_text(code: int | None) -> str:
    """How a child process ended, from its return code: "SIGKILL", "signal 99", "exit status 3"."""
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def _proc_status(pid: int | str = "self") -> dict:
    """Threads and resident bytes of a process from /proc/<pid>/status ({} where there is no /proc)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    out["rss"] = int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return {}
    return out if len(out) == 2 else {}


class _Pool:
    def __init__(self, max_workers: int):
        self.max_workers = max_workers
        self.idle: list[_Worker] = []
        self.busy = 0
        self.cond = threading.Condition()
        self._atexit = False

    @contextmanager
    def checkout(self):
        with self.cond:
            while not self.idle and self.busy >= self.max_workers:
                self.cond.wait()
            worker = self.idle.pop() if self.idle else None
            self.busy += 1
            if not self._atexit:
                atexit.register(self.shutdown)
                self._atexit = True
        keep = [False]
        try:
            if worker is None or worker.proc.poll() is not None:
                if worker is not None:
                    worker.kill()
                worker = _Worker()
            yield worker, keep
        finally:
            with self.cond:
                self.busy -= 1
                if keep[0]:
                    self.idle.append(worker)
                self.cond.notify()
            if not keep[0] and worker is not None:
                worker.kill()

    def shutdown(self) -> None:
        with self.cond:
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.kill()


_POOL = _Pool(max_workers=max(1, os.cpu_count() or 1))


def run_isolated(fn, *args, timeout: float, memory_mb: int | None = 2048, **kwargs):
    """Call `fn(*args, **kwargs)` in a worker process and return its (pickled) result.

    `fn` must be importable by name (a module-level function). Typed errors raised by `fn` are re-raised
    here unchanged. Raises `DecodeTimeoutError` after `timeout` seconds, `DecoderCrashedError` when the
    worker dies, `MediaTooLargeError` when `fn` needs more than `memory_mb` of data or resident memory
    (None: no cap).
    """
    try:
        work = Work.current()
        payload = pickle.dumps(("call", fn, args, kwargs, memory_mb, work.on_progress is not None),
                               protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"run_isolated needs a module-level function and picklable arguments: {e}") from e
    name = getattr(fn, "__qualname__", repr(fn))
    with _POOL.checkout() as (worker, keep):
        if worker.baseline is None:
            _, worker.baseline = _receive(worker, time.monotonic(), _BOOT_TIMEOUT_S, work, "start-up", None)
        start = time.monotonic()
        try:
            worker.conn.send_bytes(payload)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the worker died before or while reading; recv below reports it
        while True:
            status, value = _receive(worker, start, timeout, work, name, memory_mb)
            if status != "progress":
                break
            try:
                work.report(*value)  # a stop asked for here (or a failing watcher) ends the call
            except BaseException:
                worker.kill()
                raise
        worker.calls += 1
        # only a result or the decoder's typed verdict on the file leaves the worker fit for the next file
        if status == "ok" or (status == "err" and isinstance(value, MediaError)):
            keep[0] = _settled_near_baseline(worker, work)
        if status == "ok":
            return value
        if status == "err":
            raise value
        if status == "oom":
            raise _too_large(name, memory_mb)
        raise DecoderCrashedError(f"decode worker failed in {name}: {value}")


def _too_large(name: str, memory_mb) -> MediaTooLargeError:
    return MediaTooLargeError(
        f"decoding ({name}) needed more than the {memory_mb} MB memory cap of a decode worker; "
        "send a smaller file or raise MediaLimits.worker_memory_mb."
    )


def _settled_near_baseline(worker, work: Work) -> bool:
    """Whether the worker, having sent its result, settled back near its baseline (its "stats" message)."""
    try:
        status, stats = _receive(worker, time.monotonic(), _BOOT_TIMEOUT_S, work, "clean-up", None)
    except (DecoderCrashedError, DecodeTimeoutError, StoppedError):
        return False  # the call's result stands; this worker is not reused
    return status == "stats" and worker.reusable(stats)


def _receive(worker, start: float, timeout: float, work: Work, name: str, memory_mb) -> tuple:
    """The worker's next message, (status, value): a progress report, its start-up, the call's result or the
    worker's threads and memory after the call."""
    try:
        ready = _wait(worker, start + timeout, work, memory_mb)
    except (BrokenPipeError, ConnectionResetError, OSError):
        ready = True  # the worker died; recv below reports it
    if ready == "memory":
        raise _too_large(name, memory_mb)
    if not ready:
        worker.kill()
        raise DecodeTimeoutError(
            f"decoding ({name}) did not finish within {timeout:.1f} s and was stopped; "
            "the file is probably too long or malformed; try a smaller or re-encoded file."
        )
    try:
        reply = worker.conn.recv_bytes()
    except (EOFError, ConnectionResetError, OSError):
        how = worker.signal_name()
        hint = f" (memory cap {memory_mb} MB)" if how == "SIGABRT" and memory_mb else ""
        raise DecoderCrashedError(
            f"the decoder process died with {how}{hint} after {time.monotonic() - start:.1f} s while "
            f"running {name}; the file is probably malformed; this request failed, the next one gets a "
            "fresh decoder."
        ) from None
    try:
        return pickle.loads(reply)
    except Exception as e:  # noqa: BLE001 - e.g. an exception class that cannot be rebuilt here
        raise DecoderCrashedError(f"decode worker sent an unreadable reply from {name}: {e!r}") from None


def _wait(worker, deadline: float, work: Work, memory_mb):
    """True when the worker answered before `deadline`, False when it did not, "memory" when its resident set
    went over `memory_mb` (it is killed). Polls in short slices so that a stop or a memory blow-up acts promptly."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if worker.conn.poll(min(left, _POLL_S)):
            return True
        if work.stopped:
            worker.kill()
            raise StoppedError("stopped by the user while a file was being decoded")
        rss = worker.rss() if memory_mb else None
        if rss is not None and rss > memory_mb << 20:
            worker.kill()
            return "memory"


def shutdown_workers() -> None:
    """Stop all idle workers (busy ones stop when their call ends). Also registered with atexit."""
    _POOL.shutdown()


def worker_count() -> int:
    """Number of live idle workers (for tests and health checks)."""
    with _POOL.cond:
        return sum(1 for w in _POOL.idle if w.proc.poll() is None)


# --- worker side -------------------------------------------------------------------------------------


def _set_memory_cap(memory_mb: int | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = hard if memory_mb is None else memory_mb * (1 << 20)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _preload() -> None:
    """Map the decoders' libraries now, uncapped, so that no call ever loads one under its memory cap."""
    for name in _PRELOAD:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue  # not installed: a call that needs it fails with ImportError, and its worker is replaced
        if name == "PIL.Image":
            module.init()  # Pillow imports its format plugins lazily


def _settle(trim) -> dict:
    """Back to baseline after a call: reference cycles collected (PyAV frames hold their side data in one),
    freed heap returned to the system; then the threads and resident memory left."""
    gc.collect()
    if trim is not None:
        trim(0)
    return _proc_status()


def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc


def _sender(conn: Connection):
    """A `Work.on_progress` that sends each report to the parent (run_isolated passes it on)."""

    def send(what: str, done: int, total: int) -> None:
        conn.send_bytes(pickle.dumps(("progress", (str(what), int(done), int(total))),
                                     protocol=pickle.HIGHEST_PROTOCOL))

    return send


def _worker_main(fd: int) -> None:
    # No PR_SET_PDEATHSIG: Linux sends it when the *thread* that spawned us exits (a server's pool thread),
    # not the process. An idle worker sees EOF when the parent goes away; a busy one (maybe stuck in a
    # decoder) is stopped by this watchdog, which notices being re-parented.
    parent = os.getppid()

    def watchdog():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True, name="vl-sandbox-watchdog").start()
    conn = Connection(fd)
    _preload()
    trim = _malloc_trim()
    try:
        conn.send_bytes(pickle.dumps(("ready", _settle(trim))))
    except OSError:
        return
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return  # parent went away
        fatal = False
        try:
            _, fn, args, kwargs, memory_mb, watched = pickle.loads(message)
            _set_memory_cap(memory_mb)
            with Work(on_progress=_sender(conn) if watched else None):
                reply = ("ok", fn(*args, **kwargs))
        except MemoryError:
            reply, fatal = ("oom", None), True
        except Exception as e:  # noqa: BLE001 - every failure is reported to the parent, typed when possible
            reply = ("err", e)
        except BaseException as e:  # SystemExit, KeyboardInterrupt inside fn: report, then stop this worker
            reply, fatal = ("fail", repr(e)), True
        _set_memory_cap(None)
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            data, fatal = pickle.dumps(("oom", None)), True
        except Exception as e:  # noqa: BLE001 - an unpicklable result or exception
            data = pickle.dumps(("fail", f"{type(e).__name__}: {e} (while sending {type(reply[1]).__name__})"))
        del reply
        try:
            conn.send_bytes(data)
            if fatal:
                return
            del data
            conn.send_bytes(pickle.dumps(("stats", _settle(trim))))  # measured without the result
        except OSError:
            return
