"""vl/processing/sandbox.py: crashes, hangs and memory blow-ups in a decode worker become typed errors,
the next call gets a working worker, and many calls leak no file descriptors (docs/reliability_policy.md rows V7, V8, I12).
A worker is reused only after a result or a typed verdict on the file, and only while its threads and memory stay
near its start-up baseline; its memory cap never stops it from mapping a library (issue 52 item 3)."""

import gc
import os
import signal
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import sandbox_targets as targets  # noqa: E402

from vl.errors import CorruptMediaError, DecoderCrashedError, DecodeTimeoutError, MediaTooLargeError  # noqa: E402
from vl.processing.sandbox import run_isolated, shutdown_workers, worker_count  # noqa: E402


def _fds() -> set[str]:
    """This process's open descriptors, after a collection (so that pipes of dropped objects are closed first)."""
    gc.collect()
    return set(os.listdir("/proc/self/fd"))


def _leaked(before: set[str]) -> dict[str, str]:
    """Descriptors open now that were not open at `before`, with what they point to. A descriptor that something
    else in the process closed meanwhile (test files share a worker process under pytest-xdist) is not a leak."""
    out = {}
    for fd in _fds() - before:
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the read
            pass
    return out


def test_result_and_worker_reuse():
    assert run_isolated(targets.echo, {"a": [1, 2]}, timeout=30) == {"a": [1, 2]}
    first = run_isolated(targets.pid, timeout=30)
    assert first != os.getpid()
    assert run_isolated(targets.pid, timeout=30) == first  # pooled, not one process per call


def test_typed_errors_cross_unchanged():
    worker = run_isolated(targets.pid, timeout=30)
    with pytest.raises(CorruptMediaError, match="typed error from the worker"):
        run_isolated(targets.raise_typed, timeout=30)
    assert run_isolated(targets.pid, timeout=30) == worker  # the decoder's verdict on a file: the worker is fine


def test_a_failure_that_is_not_the_files_replaces_the_worker():
    """Issue 52 item 3: an OSError from dlopen came back as an ordinary error and the poisoned worker was kept,
    so the next valid files failed too. Anything but a typed MediaError retires the worker."""
    for _ in range(2):
        worker = run_isolated(targets.pid, timeout=30)
        with pytest.raises(OSError, match="failed to map segment"):
            run_isolated(targets.raise_os_error, timeout=30)
        assert run_isolated(targets.pid, timeout=30) != worker


def test_a_library_maps_under_the_memory_cap(tmp_path):
    """Issue 52 item 3: under RLIMIT_AS every mapped library counts against the cap, and `dlopen` failed
    ("failed to map segment from shared object"). The cap must bound data, not mappings of files: a worker
    capped below its own address space still maps a 512 MB file and loads a library it never loaded."""
    import av

    stats = run_isolated(targets.status, timeout=60)
    cap_mb = stats["VmData"] // 1024 + 128
    assert cap_mb < stats["VmSize"] // 1024, "the test needs a worker whose address space exceeds the cap"
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(512 << 20)  # sparse: no disk used
    libs = os.path.join(os.path.dirname(os.path.dirname(av.__file__)), "av.libs")
    library = tmp_path / "libcopy.so"  # a copy: dlopen maps it afresh even where the original is loaded
    library.write_bytes(open(os.path.join(libs, next(n for n in sorted(os.listdir(libs)) if "avutil" in n)),
                             "rb").read())
    for _ in range(2):
        assert run_isolated(targets.map_file_and_library, str(big), str(library), timeout=60,
                            memory_mb=cap_mb) == 512 << 20
    with pytest.raises(MediaTooLargeError):  # the cap still bounds what the worker allocates
        run_isolated(targets.allocate, 2 * cap_mb, timeout=60, memory_mb=cap_mb)


def test_a_worker_that_keeps_threads_or_memory_is_replaced():
    """Issue 52, "the isolated decode worker leaks decoder threads": a worker reports its threads and resident
    memory after each call and is replaced when they stay above its start-up baseline."""
    worker = run_isolated(targets.pid, timeout=30)
    assert run_isolated(targets.leak_threads, 1, timeout=30) == 1  # within the slack: kept
    assert run_isolated(targets.pid, timeout=30) == worker
    assert run_isolated(targets.leak_threads, 16, timeout=30) == 16
    replaced = run_isolated(targets.pid, timeout=30)
    assert replaced != worker
    assert run_isolated(targets.keep_memory, 400, timeout=60) == 400
    assert run_isolated(targets.pid, timeout=30) != replaced


def test_resident_memory_over_the_cap_kills_the_worker():
    """Memory that RLIMIT_DATA does not count (shared pages) is caught by the parent watching the worker's
    resident set: a typed MediaTooLargeError, and the next call gets a fresh worker."""
    worker = run_isolated(targets.pid, timeout=30)
    with pytest.raises(MediaTooLargeError, match="400 MB"):
        run_isolated(targets.touch_shared_memory, 800, 120, timeout=120, memory_mb=400)
    assert run_isolated(targets.pid, timeout=30) != worker


def test_unreadable_exception_is_reported_not_hung():
    with pytest.raises(DecoderCrashedError, match="unreadable reply"):
        run_isolated(targets.raise_unpicklable, timeout=30)


def test_unpicklable_function_is_a_programming_error():
    with pytest.raises(TypeError, match="module-level function"):
        run_isolated(lambda: 1, timeout=5)


@pytest.mark.parametrize("target", [targets.kill_self, targets.segfault], ids=["sigkill", "segfault"])
def test_crash_becomes_typed_error_and_worker_respawns(target):
    before = run_isolated(targets.pid, timeout=30)
    with pytest.raises(DecoderCrashedError, match="SIGKILL|SIGSEGV"):
        run_isolated(target, timeout=30)
    after = run_isolated(targets.pid, timeout=30)
    assert after != before  # a fresh worker serves the next request


def test_v8_worker_killed_mid_decode(tmp_path):
    """A worker SIGKILLed from outside while busy: that call fails with DecoderCrashedError, the next succeeds."""
    pid_file = tmp_path / "pid"

    def killer():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if pid_file.exists() and pid_file.read_text():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=killer)
    thread.start()
    with pytest.raises(DecoderCrashedError, match="SIGKILL"):
        run_isolated(targets.sleep_after_writing_pid, str(pid_file), 20, timeout=30)
    thread.join()
    assert run_isolated(targets.echo, "ok", timeout=30) == "ok"


def test_timeout_kills_and_next_call_works(tmp_path):
    """The worker past its time limit is killed then (not left to run its 30 s); the next call gets a fresh one."""
    pid_file = tmp_path / "pid"
    run_isolated(targets.echo, 0, timeout=30)  # a warm worker: the call below starts its target at once
    with pytest.raises(DecodeTimeoutError, match="did not finish within 0.5 s"):
        run_isolated(targets.sleep_after_writing_pid, str(pid_file), 30, timeout=0.5)
    busy = int(pid_file.read_text())
    assert not targets.running(busy), "the worker past its time limit is still running"
    assert run_isolated(targets.pid, timeout=30) != busy
    assert run_isolated(targets.sleep, 0, timeout=30) == 0


def test_memory_cap():
    assert run_isolated(targets.allocate, 64, timeout=30, memory_mb=1024) == 64 << 20
    with pytest.raises(MediaTooLargeError, match="1024 MB"):
        run_isolated(targets.allocate, 4096, timeout=30, memory_mb=1024)
    assert run_isolated(targets.allocate, 64, timeout=30, memory_mb=1024) == 64 << 20


def test_v7_200_sequential_calls_no_fd_leak():
    run_isolated(targets.echo, 0, timeout=30)  # warm one worker
    parent_before = _fds()
    worker_before = run_isolated(targets.open_fds, timeout=30)
    for i in range(200):
        assert run_isolated(targets.echo, i, timeout=30) == i
    assert not _leaked(parent_before)
    assert run_isolated(targets.open_fds, timeout=30) == worker_before


def test_crash_cycles_do_not_leak_fds():
    run_isolated(targets.echo, 0, timeout=30)
    before = _fds()
    for _ in range(3):
        with pytest.raises(DecoderCrashedError):
            run_isolated(targets.kill_self, timeout=30)
        run_isolated(targets.echo, 0, timeout=30)
    assert not _leaked(before)


def test_concurrent_calls_use_separate_workers():
    results = []

    def call():
        results.append(run_isolated(targets.sleep, 0.5, timeout=30))

    threads = [threading.Thread(target=call) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert results == [0.5, 0.5]


def test_shutdown_stops_idle_workers():
    run_isolated(targets.echo, 0, timeout=30)
    assert worker_count() >= 1
    shutdown_workers()
    assert worker_count() == 0
    assert run_isolated(targets.echo, 1, timeout=30) == 1


def test_worker_outlives_the_thread_that_spawned_it():
    """Regression: PR_SET_PDEATHSIG fires when the spawning *thread* exits, which killed pooled workers that a
    server's request thread had started."""
    shutdown_workers()
    spawned = []
    thread = threading.Thread(target=lambda: spawned.append(run_isolated(targets.pid, timeout=30)))
    thread.start()
    thread.join()
    time.sleep(0.2)
    assert run_isolated(targets.pid, timeout=30) == spawned[0]


@pytest.mark.parametrize("code, text", [(-9, "SIGKILL"), (-11, "SIGSEGV"), (-250, "signal 250"), (3, "exit status 3"),
                                        (0, "exit status 0"), (None, "unknown exit")])
def test_exit_text_names_how_a_worker_ended(code, text):
    from vl.processing.sandbox import exit_text

    assert exit_text(code) == text
