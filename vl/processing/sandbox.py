"""Run a decode step in a killable worker process with a wall-clock timeout and a memory cap.

Why (docs/reliability_policy.md §0 rule 5, §1.3, §1.4): decord aborts or segfaults the interpreter on bad streams,
PDFium has a history of segfaults, and Pillow's maintainers put "sandboxed subprocess" first. A crash or a
hang in a worker must become one typed error for that request while the server keeps serving.

Design:
- Workers are plain `python -c ...` subprocesses (not `multiprocessing`), so they never re-import the
  caller's `__main__` (which may load a model); they import only the module of the function they run.
  The caller's `sys.path` is handed over so test helpers and editable installs import the same way.
- Parent and worker talk over one socketpair with `multiprocessing.connection` framing (pickle).
- Each call sets the worker's RLIMIT_AS soft limit to `memory_mb`; a `MemoryError` there becomes
  `MediaTooLargeError`, and the worker is replaced because its heap may be fragmented.
- A worker that dies (SIGKILL, SIGSEGV, abort) gives `DecoderCrashedError`; one that does not answer within
  `timeout` is killed and gives `DecodeTimeoutError`. Either way it is discarded and the next call starts a
  fresh one (respawn is lazy: no process is started until it is needed).
- A stop asked for while waiting (the current request's `vl.processing.progress.Work`) kills the worker at
  once and raises `StoppedError`: a stopped request's decode does not run on to its end.
- When that `Work` is watched, the function runs in the worker under a `Work` whose reports (e.g. "video frames
  decoded" i/n) are sent to the parent as they happen and passed on to the caller's `Work` (which is also a
  stop point: a stop asked for by the watcher kills the worker). Reports do not extend the timeout.
- Idle workers are pooled (at most `os.cpu_count()` of them) and reused, so sequential calls do not leak fds.
"""

import atexit
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

from vl.errors import DecoderCrashedError, DecodeTimeoutError, MediaTooLargeError, StoppedError
from vl.processing.progress import Work

__all__ = ["run_isolated", "shutdown_workers", "worker_count"]

_BOOT = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
    "from vl.processing.sandbox import _worker_main; _worker_main(int(sys.argv[2]))"
)


class _Worker:
    def __init__(self):
        parent_sock, child_sock = socket.socketpair()
        paths = [p for p in sys.path if p]

        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(paths), str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                # glibc reserves 64 MiB of address space per thread arena; decoder threads would otherwise eat
                # the RLIMIT_AS budget on many-core machines without using the memory
                env={**os.environ, "MALLOC_ARENA_MAX": "2"},
            )
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.calls = 0

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
    worker dies, `MediaTooLargeError` when `fn` exceeds `memory_mb` of address space (None: no cap).
    """
    try:
        work = Work.current()
        payload = pickle.dumps(("call", fn, args, kwargs, memory_mb, work.on_progress is not None),
                               protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"run_isolated needs a module-level function and picklable arguments: {e}") from e
    name = getattr(fn, "__qualname__", repr(fn))
    with _POOL.checkout() as (worker, keep):
        start = time.monotonic()
        try:
            worker.conn.send_bytes(payload)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the worker died before or while reading; recv below reports it
        while True:
            status, value = _receive(worker, start, timeout, work, name, memory_mb, keep)
            if status != "progress":
                break
            try:
                work.report(*value)  # a stop asked for here (or a failing watcher) ends the call
            except BaseException:
                worker.kill()
                raise
        worker.calls += 1
        if status == "ok":
            keep[0] = True
            return value
        if status == "err":
            keep[0] = True
            raise value
        if status == "oom":
            raise MediaTooLargeError(
                f"decoding ({name}) needed more than the {memory_mb} MB memory cap of a decode worker; "
                "send a smaller file or raise MediaLimits.worker_memory_mb."
            )
        raise DecoderCrashedError(f"decode worker failed in {name}: {value}")


def _receive(worker, start: float, timeout: float, work: Work, name: str, memory_mb, keep) -> tuple:
    """The worker's next message, (status, value): a progress report or the call's result."""
    try:
        ready = _wait(worker, start + timeout, work)
    except (BrokenPipeError, ConnectionResetError, OSError):
        ready = True  # the worker died; recv below reports it
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
        keep[0] = True
        raise DecoderCrashedError(f"decode worker sent an unreadable reply from {name}: {e!r}") from None


def _wait(worker, deadline: float, work: Work) -> bool:
    """Whether the worker answered before `deadline`; polls in short slices so that a stop kills it promptly."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if worker.conn.poll(min(left, 0.1) if work.cancel is not None else left):
            return True
        if work.stopped:
            worker.kill()
            raise StoppedError("stopped by the user while a file was being decoded")


def shutdown_workers() -> None:
    """Stop all idle workers (busy ones stop when their call ends). Also registered with atexit."""
    _POOL.shutdown()


def worker_count() -> int:
    """Number of live idle workers (for tests and health checks)."""
    with _POOL.cond:
        return sum(1 for w in _POOL.idle if w.proc.poll() is None)


# --- worker side -------------------------------------------------------------------------------------


def _set_memory_cap(memory_mb: int | None) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = hard if memory_mb is None else memory_mb * (1 << 20)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


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
        try:
            conn.send_bytes(data)
        except OSError:
            return
        if fatal:
            return
