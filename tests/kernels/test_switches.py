"""The `VL_*` environment switches: one typed record (vl/kernels/switches.py), the same table in docs/switches.md,
the only module of the product that reads them from the environment, one set of parsing rules (today's spellings
kept, a bad value a ConfigError naming the switch and what it takes), and each switch steering what it says."""

import ast
import re
from pathlib import Path

import pytest

from vl.errors import ConfigError
from vl.kernels import switches

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("vl", "ui", "eval", "data_recipes", "token_reduction", "scripts")
RECORD = ROOT / "vl" / "kernels" / "switches.py"


def env_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every read of a `VL_*` environment variable in a Python source: `os.environ.get("VL_X")`,
    `os.getenv("VL_X")`, `os.environ["VL_X"]` (not as an assignment target), `"VL_X" in os.environ`; and of every
    read whose name is computed ("<computed>"), which could be one (as a `mode(var)` helper's was)."""
    out = []

    def environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    def vl_name(node) -> str | None:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            return "<computed>"
        return node.value if node.value.startswith("VL_") else None

    for node in ast.walk(ast.parse(source)):
        name = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in ("get", "pop") and environ(f.value)) or f.attr == "getenv":
                name = vl_name(node.args[0]) if f.attr != "pop" else None
        elif isinstance(node, ast.Subscript) and environ(node.value) and isinstance(node.ctx, ast.Load):
            name = vl_name(node.slice)
        elif isinstance(node, ast.Compare) and len(node.comparators) == 1 and environ(node.comparators[0]):
            name = vl_name(node.left)
        if name:
            out.append((node.lineno, name))
    return out


def test_the_scanner_finds_each_way_of_reading_a_switch():
    planted = ('import os\nos.environ.get("VL_A", "1")\nos.getenv("VL_B")\nx = os.environ["VL_C"]\n'
               'if "VL_D" in os.environ: pass\nos.environ["VL_E"] = "0"\nos.environ.get("HOME")\n'
               'def mode(var): return os.environ.get(var, "auto")\n')
    assert [n for _, n in sorted(env_reads(planted))] == ["VL_A", "VL_B", "VL_C", "VL_D", "<computed>"]


def test_only_the_record_reads_vl_switches_from_the_environment():
    found = []
    for pkg in PRODUCT:
        for path in (ROOT / pkg).rglob("*.py"):
            if path != RECORD:
                found += [f"{path.relative_to(ROOT)}:{line} reads {name}" for line, name in env_reads(path.read_text())]
    assert not found, "read these through vl.kernels.switches.get / on:\n" + "\n".join(found)


def test_every_switch_the_product_names_is_declared():
    """A `VL_*` name handed to the record anywhere in the product is one it declares (a typo fails here, not at
    run time on the one machine that sets it)."""
    names = set()
    for pkg in PRODUCT:
        for path in (ROOT / pkg).rglob("*.py"):
            names |= set(re.findall(r"""(?:switches\.(?:get|on)|linux_switch|loader\.mode|mode)\(\s*["'](VL_\w+)""",
                                    path.read_text()))
    assert names and names <= set(switches.BY_NAME), sorted(names - set(switches.BY_NAME))


def test_docs_table_is_the_record():
    text = (ROOT / "docs" / "switches.md").read_text()
    assert switches.markdown_table() in text
    rows = [line for line in text.splitlines() if line.startswith("| `VL_")]
    assert [re.match(r"\| `(VL_\w+)`", r).group(1) for r in rows] == [s.name for s in switches.SWITCHES]


@pytest.mark.parametrize("raw,want", [(None, "auto"), ("", "auto"), ("  ", "auto"), ("portable", "portable"),
                                      (" OFF ", "off"), ("Auto", "auto")])
def test_a_mode_takes_todays_spellings(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("VL_SSD_KERNEL", raising=False)
    else:
        monkeypatch.setenv("VL_SSD_KERNEL", raw)
    assert switches.get("VL_SSD_KERNEL") == want


@pytest.mark.parametrize("raw,want", [(None, True), ("", True), ("1", True), ("on", True), ("Yes", True),
                                      ("true", True), ("0", False), ("off", False), (" NO ", False),
                                      ("false", False)])
def test_an_on_off_switch_takes_todays_spellings(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("VL_HUGEPAGES", raising=False)
    else:
        monkeypatch.setenv("VL_HUGEPAGES", raw)
    assert switches.on("VL_HUGEPAGES") is want


@pytest.mark.parametrize("name,raw,accepted", [("VL_CPU_DECODE", "fast", "auto | portable | off"),
                                               ("VL_CPU_GEMM", "mkl", "auto | onednn | blas"),
                                               ("VL_HEAP_KEEP", "2", "on (on|1|yes|true) or off (off|0|no|false)")])
def test_a_bad_value_is_a_config_error_naming_the_switch_and_what_it_takes(monkeypatch, name, raw, accepted):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigError) as e:
        switches.get(name)
    assert f"{name}={raw!r}" in str(e.value) and accepted in str(e.value) and e.value.code == "bad_config"


def test_paths_and_text_are_taken_as_they_are(monkeypatch):
    monkeypatch.setenv("VL_API_KEY", " Secret Key ")
    monkeypatch.setenv("VL_KERNEL_CACHE", " /tmp/Some Dir ")
    assert switches.get("VL_API_KEY") == " Secret Key " and switches.get("VL_KERNEL_CACHE") == "/tmp/Some Dir"
    monkeypatch.delenv("VL_API_KEY")
    assert switches.get("VL_API_KEY") is None
    with pytest.raises(KeyError):
        switches.get("VL_NOT_A_SWITCH")


def test_each_consumer_reads_its_switch_through_the_record(monkeypatch, tmp_path):
    """A bad value reaches the code the switch steers as the record's error, and a good one steers it."""
    from vl.kernels import gemv, loader, ssd_scan
    from vl.runtime.cpu import decode as cpu_decode
    from vl.runtime.cpu import heap, matmul
    from vl.server.cli import parse_args

    monkeypatch.setenv("VL_SSD_KERNEL", "sometimes")
    with pytest.raises(ConfigError, match="VL_SSD_KERNEL"):
        ssd_scan.status()
    monkeypatch.setenv("VL_SSD_KERNEL", "OFF")
    assert "VL_SSD_KERNEL=off" in ssd_scan.status()
    monkeypatch.setenv("VL_QUANT_KERNEL", "off")
    assert gemv.kernel() is None and "VL_QUANT_KERNEL=off" in gemv.status()
    monkeypatch.setenv("VL_CPU_DECODE", "off")
    assert "VL_CPU_DECODE=off" in cpu_decode.status()
    monkeypatch.setenv("VL_SPARSE_DOWN", "no")
    assert matmul.sparse_down_off() == "VL_SPARSE_DOWN=off"
    monkeypatch.setenv("VL_HEAP_KEEP", "off")
    assert heap.linux_switch("VL_HEAP_KEEP") is False
    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path))
    assert loader._cache_dir() == tmp_path
    monkeypatch.setenv("VL_API_KEY", "k")
    assert parse_args([]).api_key == "k"


def test_a_command_default_yields_to_the_environment_and_ends_with_its_block(monkeypatch):
    """`vl serve` loads with VL_SPARSE_DOWN off by its own default; the user's variable still decides, and outside
    the block the record's default is back."""
    monkeypatch.delenv("VL_SPARSE_DOWN", raising=False)
    assert switches.on("VL_SPARSE_DOWN")
    with switches.command_default("VL_SPARSE_DOWN", "off"):
        assert not switches.on("VL_SPARSE_DOWN")
        monkeypatch.setenv("VL_SPARSE_DOWN", "on")
        assert switches.on("VL_SPARSE_DOWN")
        monkeypatch.setenv("VL_SPARSE_DOWN", " ")  # empty reads as unset
        assert not switches.on("VL_SPARSE_DOWN")
    assert switches.on("VL_SPARSE_DOWN")
    with pytest.raises(ConfigError, match="VL_SPARSE_DOWN"):
        with switches.command_default("VL_SPARSE_DOWN", "sometimes"):
            pass
