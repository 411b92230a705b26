"""Module-level functions for sandbox tests (a worker imports them by name, so they cannot live in a test body)."""

import os
import signal
import time

from vl.errors import CorruptMediaError


def echo(x):
    return x


def pid():
    return os.getpid()


def sleep(seconds: float):
    time.sleep(seconds)
    return seconds


def sleep_after_writing_pid(path: str, seconds: float):
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    return "finished"


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie does not): for the tests, not a worker target."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_self(sig: int = signal.SIGKILL):
    os.kill(os.getpid(), sig)
    time.sleep(5)


def segfault():
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV


def allocate(mb: int):
    block = bytearray(mb << 20)
    return len(block)


def raise_typed():
    raise CorruptMediaError("typed error from the worker")


class _Unpicklable(Exception):
    def __init__(self, a, b):  # pickling rebuilds with one argument: fails on load in the parent
        super().__init__(a)
        self.b = b


def raise_unpicklable():
    raise _Unpicklable("x", "y")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def raise_os_error():
    raise OSError("libdecord.so: failed to map segment from shared object")  # as dlopen says under RLIMIT_AS


_KEPT = []  # what keep_memory / leak_threads leave behind in the worker


def leak_threads(n: int) -> int:
    import threading

    stop = threading.Event()
    for _ in range(n):
        threading.Thread(target=stop.wait, daemon=True).start()
    _KEPT.append(stop)
    return n


def keep_memory(mb: int) -> int:
    block = bytearray(mb << 20)
    block[:: 4096] = b"\x01" * len(range(0, len(block), 4096))  # touch every page: resident, not just reserved
    _KEPT.append(block)
    return mb


def status() -> dict:
    """The worker's own /proc/self/status figures (kB, threads)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmSize", "VmData", "VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def map_file_and_library(path: str, library: str) -> int:
    """What loading a shared library does: map a file read-only (the library's code) and dlopen one."""
    import ctypes
    import mmap

    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    size = len(mapped)
    mapped.close()
    ctypes.CDLL(library)
    return size


def touch_shared_memory(mb: int, seconds: float) -> int:
    """Resident memory that RLIMIT_DATA does not count (shared anonymous pages), held for `seconds`."""
    import mmap

    block = mmap.mmap(-1, mb << 20, flags=mmap.MAP_SHARED)
    for offset in range(0, mb << 20, 4096):
        block[offset] = 1
    time.sleep(seconds)
    return mb


def decode_video_with_enomem(path: str, limits):
    """decode_video_file in a worker where FFmpeg's frame conversion fails with ENOMEM (av.error.MemoryError),
    as it did under the old address-space cap."""
    import errno

    import av

    from vl.processing import video

    def enomem(self, frame, tile_size, limits):
        av.error.err_check(-errno.ENOMEM)

    video._Display.tile = enomem  # this worker is replaced after the call (a MemoryError), so the patch dies with it
    return video.decode_video_file(path, limits, 32, 2.0, 8, "pyav")
