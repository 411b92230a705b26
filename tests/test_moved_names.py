"""The old names of moved modules (vl/__init__.py, MOVED) answer for one release: every way users import them gets
the new home's objects, each first use warns with the new name, and neither `import vl` nor the probes other
libraries make of every module in sys.modules (inspect, the import system) import the new homes or warn."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import vl

ROOT = Path(__file__).resolve().parent.parent
# old module -> a name users take from it (docs/server.md: RemoteEngine; docs/app_and_cli.md: the PDF page cap)
USED = {"vl.remote": "RemoteEngine", "vl.cli_flags": "INTERACTIVE_PDF_PAGES", "vl.chat_cli": "main",
        "vl.native": "build", "vl.cpu_gemm": "linear", "vl.bench_geometry": "run", "vl.bench_llama_cpp": "LlamaCpp",
        "vl.bench_timing": "our_decode_s"}


def test_every_moved_module_has_a_case_here():
    assert set(USED) == set(vl.MOVED)


@pytest.mark.parametrize("old", sorted(USED))
def test_the_old_name_gives_the_new_homes_objects_and_warns(old):
    new = importlib.import_module(vl.MOVED[old])
    name = USED[old]
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {vl.MOVED[old]}"):
        assert getattr(importlib.import_module(old), name) is getattr(new, name)
    with pytest.warns(DeprecationWarning, match=old):  # `import vl.x` then `vl.x.name`, and `from vl import x`
        assert getattr(getattr(vl, old.split(".")[1]), name) is getattr(new, name)
    with pytest.raises(AttributeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        getattr(importlib.import_module(old), "no_such_name")


def test_the_import_statements_users_write_work_and_point_at_their_line():
    with pytest.warns(DeprecationWarning) as caught:
        from vl.remote import RemoteEngine
        import vl.cli_flags
        from vl import chat_cli

        pages = vl.cli_flags.INTERACTIVE_PDF_PAGES
        main = chat_cli.main
    from vl.cli.chat import main as new_main
    from vl.cli.flags import INTERACTIVE_PDF_PAGES
    from vl.server.client import RemoteEngine as New

    assert (RemoteEngine, pages, main) == (New, INTERACTIVE_PDF_PAGES, new_main)
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}  # stacklevel: the caller's line


def test_import_vl_loads_no_new_home_and_probes_do_not_warn():
    """A fresh interpreter: `import vl` and inspect's walk over sys.modules (it reads `__file__` of each) neither
    import the moved modules' new homes nor warn; the documented import then warns and works."""
    code = ("import inspect, sys, warnings; warnings.simplefilter('error'); import vl; "
            "inspect.getmodule(inspect.getmodule.__code__); "  # a code object: inspect walks sys.modules
            "print(sorted(m for m in ('vl.server.client', 'vl.cli', 'vl.cli.chat', 'vl.cli.flags') "
            "if m in sys.modules)); "
            "warnings.simplefilter('default'); from vl.remote import RemoteEngine; print(RemoteEngine.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "vl.server.client"], out.stdout
    assert "DeprecationWarning: vl.remote moved to vl.server.client" in out.stderr, out.stderr

