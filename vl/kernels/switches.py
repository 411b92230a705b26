"""Every `VL_*` environment switch of the product, declared once: its name, the values it takes, its default and
what it changes. This is the one place that reads `os.environ` for a `VL_*` name; the code that a switch steers
asks `get(name)` (or `on(name)` for an on/off switch) where it used to read the environment, so a value set by a
test or a launcher before that point is seen, and every switch is parsed by the same rules:

- surrounding spaces are ignored, and case too, except in a path or a free text;
- unset or empty is the default;
- an on/off switch takes on|1|yes|true and off|0|no|false;
- anything else is a `ConfigError` that names the switch, the value and the accepted values.

docs/switches.md lists the same table (`markdown_table()`; tests/kernels/test_switches.py keeps the two equal and
checks that nothing else in the product reads a `VL_*` variable). Switches only tests read (e.g.
`VL_UPDATE_SCREENSHOTS`) stay in the tests; the `VL_*` macros of the C++ sources (`VL_PORTABLE`, `VL_AVX512`, ...)
are compiler defines, not environment switches. No torch import: the app's heap pass reads its switch in a bare
process.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from vl.errors import ConfigError

ON, OFF = ("on", "1", "yes", "true"), ("off", "0", "no", "false")
KINDS = ("mode", "choice", "flag", "path", "text")


@dataclass(frozen=True)
class Switch:
    """One environment switch. `kind`: "mode" / "choice" (one of `values`), "flag" (on | off), "path" or "text"
    (any string, taken as it is). `default`: the value when unset or empty (None: nothing). `effect`: what it
    changes, in a sentence."""

    name: str
    kind: str
    default: str | None
    effect: str
    values: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if not self.name.startswith("VL_") or self.kind not in KINDS:
            raise ValueError(f"switch {self.name!r} of kind {self.kind!r}")
        if self.kind == "flag":
            object.__setattr__(self, "values", ("on", "off"))
        if self.values and self.default not in self.values:
            raise ValueError(f"{self.name}: default {self.default!r} is not one of {self.values}")

    def parse(self, raw: str | None) -> str | None:
        """The switch's value from the environment's text (None: unset) -> the canonical value."""
        if self.kind == "text":
            return raw if raw else self.default
        got = (raw or "").strip()
        if not got:
            return self.default
        if self.kind == "path":
            return got
        got = got.lower()
        if self.kind == "flag":
            got = "on" if got in ON else "off" if got in OFF else got
        if got not in self.values:
            raise ConfigError(f"{self.name}={raw!r} is not a value it takes: expected {self.accepted()}; "
                              f"unset it for the default ({self.default})")
        return got

    def accepted(self) -> str:
        if self.kind == "flag":
            return f"on ({'|'.join(ON)}) or off ({'|'.join(OFF)})"
        if self.kind in ("path", "text"):
            return f"any {self.kind}"
        return " | ".join(self.values)


_MODES = ("auto", "portable", "off")
SWITCHES = (
    Switch("VL_KERNEL_CACHE", "path", None,
           "where the C++ kernels are compiled to and loaded from, one library per source (with its headers), "
           "flags, compiler and CPU; unset: `$XDG_CACHE_HOME/vl/kernels`, else `~/.cache/vl/kernels`"),
    Switch("VL_SSD_KERNEL", "mode", "auto",
           "the CPU prefill's SSD scan: auto = the C++ scan where it builds with AVX512, else the torch reference; "
           "portable = the plain C++ loops on any CPU; off = the torch reference", _MODES),
    Switch("VL_ATTENTION_KERNEL", "mode", "auto",
           "the vision towers' self-attention and the audio encoder's relative-position attention in bf16 on the "
           "CPU: auto = the C++ kernel on AMX tiles where the CPU has AMX-BF16, else torch's "
           "(scaled_dot_product_attention; the audio encoder's own torch path); portable (a build without tiles) "
           "and off = torch's everywhere", _MODES),
    Switch("VL_QUANT_KERNEL", "mode", "auto",
           "the few-row GEMV library (weight-only FP8 / NVFP4 decode, the dense decode GEMV pass, and so the "
           "fused step on packed weights): auto = the native build (AVX512 intrinsics where the CPU has them, "
           "else its plain loops; Linux); portable = the plain C++ loops; off = dequantize and torch's GEMM", _MODES),
    Switch("VL_CPU_DECODE", "mode", "auto",
           "the fused C++ decode step (decode mode `fused`): auto = its AVX512 build where the CPU has it, else "
           "the modules; portable = the plain C++ loops; off = decode through the modules", _MODES),
    Switch("VL_CPU_GEMM", "choice", "auto",
           "which library runs many-row fp32 products: auto = oneDNN on x86 CPUs not made by Intel where torch "
           "uses MKL, else torch's BLAS; onednn; blas", ("auto", "onednn", "blas")),
    Switch("VL_NVFP4_TILES", "choice", "auto",
           "NVFP4 products of bf16 models on AMX tiles (CPUs with AMX-BF16): auto = calls and decode batches of "
           "5 rows or more, a joining prompt's chunk and prompts up to 512 rows, fewer rows keep the float32 loop; "
           "on = every row (a row's bits never depend on its batch; one row alone about 1.5x slower); off = never; "
           "read at load", ("auto", "on", "off")),
    Switch("VL_SPARSE_DOWN", "flag", "on",
           "ReLU^2 MLP down_proj weights stored by input rows at load, so decode skips the rows of zero inputs "
           "(where the GEMV library builds with AVX512)"),
    Switch("VL_HUGEPAGES", "flag", "on",
           "large CPU weights moved onto 2 MiB pages at load (Linux transparent huge pages)"),
    Switch("VL_ENCODER_PAGES", "choice", "auto",
           "the vision / audio encoders' weights on a CPU: keep = read into memory at load and kept; release = "
           "mapped from the checkpoint and in memory only while an encoder runs; auto = release on Linux when the "
           "checkpoint's files hold more than 60% of the machine's RAM, else keep", ("auto", "keep", "release")),
    Switch("VL_HEAP_KEEP", "flag", "on",
           "freed heap blocks of any size stay in the process for reuse between trims (glibc, Linux; other threads "
           "than the main one: up to 64 MiB)"),
    Switch("VL_GPU_LIBS_PAGEOUT", "flag", "on",
           "without a CUDA device, the pages of the CUDA libraries that `import torch` mapped go back at load "
           "(Linux)"),
    Switch("VL_API_KEY", "text", None,
           "the default of `vl serve --api-key`: requests to /v1/* need `Authorization: Bearer KEY`; unset: open"),
)
BY_NAME = {s.name: s for s in SWITCHES}


_command_defaults: dict[str, str] = {}  # a command's own defaults (`command_default`), under the environment's


def get(name: str) -> str | None:
    """The switch's current value (canonical; its default when unset). Raises `ConfigError` on a value it does
    not take, KeyError for a name that is not declared above."""
    raw = os.environ.get(name)
    return BY_NAME[name].parse(raw if raw and raw.strip() else _command_defaults.get(name))


@contextlib.contextmanager
def command_default(name: str, value: str):
    """Inside the block, `name` reads as `value` where the environment leaves it unset: a command's own default
    (`vl serve` loads the ReLU^2 down_proj as stored, docs/server.md), which the user's variable still overrides."""
    BY_NAME[name].parse(value)  # a value the switch takes
    old = _command_defaults.get(name)
    _command_defaults[name] = value
    try:
        yield
    finally:
        if old is None:
            _command_defaults.pop(name, None)
        else:
            _command_defaults[name] = old


def on(name: str) -> bool:
    """Whether an on/off switch is on."""
    if BY_NAME[name].kind != "flag":
        raise KeyError(f"{name} is a {BY_NAME[name].kind} switch, not an on/off one")
    return get(name) == "on"


def markdown_table() -> str:
    """The record as docs/switches.md shows it."""
    rows = ["| switch | values | default | what it changes |", "|---|---|---|---|"]
    for s in SWITCHES:
        values = {"flag": "on \\| off", "path": "a directory", "text": "any text"}.get(
            s.kind, " \\| ".join(f"`{v}`" for v in s.values))
        default = "unset" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.name}` | {values} | {default} | {s.effect} |")
    return "\n".join(rows)
