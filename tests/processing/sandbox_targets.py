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
