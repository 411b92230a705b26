"""The native code's one home: every C++ source of the product under vl/kernels/csrc/, headers shared instead of a
.cpp including a .cpp, every source shipped as package data (an installed, non-editable package builds them), each
wrapper's source found through the loader (never through another module's file), and the compile cache keyed on
the source with the headers it includes, so a changed header rebuilds."""

import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

from vl.kernels import attention, decode_step, gemv, loader, ssd_scan

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("vl", "ui", "eval", "data_recipes", "token_reduction")
NATIVE = (".cpp", ".cc", ".c", ".h", ".hpp", ".cu")


def _includes(path: Path) -> list[str]:
    return re.findall(r'^\s*#include\s+"([^"]+)"', path.read_text(), re.M)


def test_every_native_source_of_the_product_is_in_csrc():
    found = {p.relative_to(ROOT) for pkg in PRODUCT for p in (ROOT / pkg).rglob("*") if p.suffix in NATIVE}
    assert found and all(p.parent == Path("vl/kernels/csrc") for p in found), sorted(map(str, found))


def test_no_source_includes_a_source_and_every_include_is_a_csrc_header():
    for src in loader.CSRC.iterdir():
        for inc in _includes(src):
            assert inc.endswith(".h") and (loader.CSRC / inc).is_file() and "/" not in inc, f"{src.name}: {inc}"


def test_each_wrapper_builds_its_own_csrc_source_which_exports_vl_isa():
    for module in (gemv, ssd_scan, decode_step, attention):
        assert module.SOURCE.parent == loader.CSRC and module.SOURCE.is_file(), module.__name__
        assert re.search(r"^int vl_isa\(\)", module.SOURCE.read_text(), re.M), module.SOURCE.name
    sources = {p.name for p in loader.CSRC.glob("*.cpp")}
    assert sources == {m.SOURCE.name for m in (gemv, ssd_scan, decode_step, attention)}


def test_the_sources_are_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["vl"]
    for src in loader.CSRC.iterdir():
        rel = src.relative_to(ROOT / "vl").as_posix()
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in data), f"{rel} is not in vl's package-data {data}"


def test_a_changed_header_gives_a_new_cache_key(tmp_path, monkeypatch):
    """Two builds of one copy of the scan's sources, the shared header edited between them: two libraries. The
    compiler is replaced by a stand-in that writes the output file (the key, not the compiler, is under test)."""
    src = tmp_path / "csrc"
    src.mkdir()
    for name in ("ssd_scan.cpp", "simd_exp.h"):
        (src / name).write_text((loader.CSRC / name).read_text())
    compiled = []

    def fake_run(cmd, **kw):
        if "--version" in cmd:
            return subprocess.CompletedProcess(cmd, 0, stdout="c++ (stand-in) 1.0\n", stderr="")
        Path(cmd[cmd.index("-o") + 1]).write_bytes(b"lib")
        compiled.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    monkeypatch.setattr(loader.subprocess, "run", fake_run)
    monkeypatch.setenv("CXX", "c++")
    monkeypatch.setenv("VL_KERNEL_CACHE", str(tmp_path / "cache"))
    first = loader.build(src / "ssd_scan.cpp", portable=True)
    assert loader.build(src / "ssd_scan.cpp", portable=True) == first and len(compiled) == 1  # cached
    (src / "simd_exp.h").write_text((src / "simd_exp.h").read_text() + "\n// changed\n")
    second = loader.build(src / "ssd_scan.cpp", portable=True)
    assert second != first and len(compiled) == 2
    assert loader.build(src / "ssd_scan.cpp") not in (first, second)  # the flags are in the key too
