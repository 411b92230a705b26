"""The package's plain C++ kernels (csrc/), compiled at first use into a per-CPU cache and loaded with ctypes.

The sources include no torch headers, so each compiles in a few seconds with the system's C++ compiler. The
result is cached in `$VL_KERNEL_CACHE` (default `~/.cache/vl/kernels`) under a key of the source (with the headers
it includes, so a changed header rebuilds), the flags, the compiler's version and the CPU's flags, so a library is
never loaded on a machine it was not built for. `load` is the one way a module gets its kernel: a mode (auto |
portable | off, from the kernel's `VL_*` switch) in, the library or the reason there is none out; the module logs
the reason once and runs its torch twin. Every library is a `Library`: its functions typed once from a table, its
instruction set read from the `vl_isa()` that every source exports.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from vl.kernels import switches

BUILD_TIMEOUT_S = 120
MODES = ("auto", "portable", "off")
CSRC = Path(__file__).with_name("csrc")  # every C++ source and header of the package
ISA = {2: "avx512", 0: "portable"}  # what a source's vl_isa() returns


def _cache_dir() -> Path:
    env = switches.get("VL_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vl" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    line = _cpu_flags()
    return set(line.split(":", 1)[1].split()) if line.startswith("flags") else set()


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _flags(portable: bool, defines: tuple[str, ...] = ()) -> list[str]:
    # -march=native: the binary is cached per CPU (flags in the key), never shipped to another machine. -O3, not
    # -O2: at -O2 g++ 12 keeps the row kernels' per-row accumulator arrays (acc[M][...]) in memory for M > 1, and
    # batched decode ran 1.5-2.2x slower (docs/cpu_decode.md, "Build time").
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
    return flags + (["-DVL_PORTABLE"] if portable else []) + [f"-D{d}" for d in defines]


def _source_text(source: Path) -> str:
    """The source and, recursively, the headers of csrc/ it includes with `#include "..."` (part of the cache key)."""
    text = source.read_text()
    parts = [text]
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('#include "'):
            parts.append(_source_text(source.parent / line.split('"')[1]))
    return "\0".join(parts)


def build(source: Path, portable: bool = False, defines: tuple[str, ...] = ()) -> Path:
    """Compile one of the kernel sources of csrc/ into the cache (or find it there); -> path of the shared
    library. `portable`: the plain C++ loops (-DVL_PORTABLE) instead of the AVX512 ones; `defines`: extra
    `NAME=VALUE` macros (tests use them to build a loop the CPU would not pick by default). Raises on failure."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (g++, c++ or clang++ on PATH, or $CXX)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([_source_text(source), " ".join(_flags(portable, defines)), version, _cpu_flags(),
                                    platform.machine()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"{source.stem}-{'portable-' if portable else ''}{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # build aside, then rename: concurrent builders
    os.close(fd)
    try:
        r = subprocess.run([cxx, *_flags(portable, defines), "-o", tmp, str(source)], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
        if r.returncode != 0:
            raise RuntimeError(f"{cxx} failed (exit {r.returncode}): {r.stderr.strip()[-600:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def mode(var: str) -> str:
    """A kernel's mode from its switch (vl/kernels/switches.py): auto (the default), portable (the plain C++ loops)
    or off; anything else is a ConfigError."""
    return switches.get(var)


def load(source: Path, mode: str, var: str, what: str, wrap: Callable[[Path], object], *,
         linux_only_in_auto: bool = False, avx512_in_auto: bool = True) -> tuple[object | None, str]:
    """Build (or find) `source` for `mode` and wrap the library (`wrap(path)`, which has an `isa` attribute) ->
    (library, "ok") or (None, why). `var` names the mode's environment variable and `what` the kernel, in the
    reasons. Not on Linux: none (in auto mode only, with `linux_only_in_auto`). `avx512_in_auto`: in auto mode a
    build without AVX512 is not used (its plain loops were not measured faster than torch there)."""
    if mode == "off":
        return None, f"{var}=off"
    if platform.system() != "Linux" and (mode == "auto" or not linux_only_in_auto):  # built and tested on Linux only
        return None, f"{what} is built on Linux only (this is {platform.system()})"
    try:
        lib = wrap(build(source, portable=mode == "portable"))
    except Exception as e:  # noqa: BLE001 -- any build/load failure means: run the reference, say why
        return None, f"{type(e).__name__}: {e}"
    if avx512_in_auto and mode == "auto" and getattr(lib, "isa", None) != "avx512":
        return None, f"this CPU lacks AVX512 ({var}=portable forces the plain C++ loops)"
    return lib, "ok"


class Library:
    """A built kernel library: `functions` ({name: (argtypes, restype)}) typed once on the ctypes handle `lib`;
    `path`; `isa` ("avx512" | "portable"), from the `vl_isa()` every source exports. Kernels with Python-side
    helpers subclass it (vl/kernels/gemv.py); the others use it as it is."""

    functions: dict = {}

    def __init__(self, path: Path, functions: dict | None = None):
        lib = ctypes.CDLL(str(path))
        for name, (argtypes, restype) in {**self.functions, **(functions or {})}.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        lib.vl_isa.restype = ctypes.c_int
        self.lib, self.path = lib, path
        self.isa = ISA.get(lib.vl_isa(), "unknown")
