"""vl/runtime/cpu/heap.py at load time: every load gives the heap's free pages back, then keeps what a prefill frees for
reuse (the trim itself is tested in tests/ui/test_ui_heap.py)."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from vl.runtime.cpu import heap


def test_every_load_trims_the_heap_then_keeps_freed_memory(monkeypatch, tmp_path):
    import vl
    from tiny_models import save_hf_nemotron

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    calls = []
    monkeypatch.setattr(heap, "trim_heap", lambda: calls.append("trim") or True)
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append("keep") or True)
    vl.load_pretrained(path)
    assert calls == ["trim", "keep"]


_PROBE = textwrap.dedent("""
    import ctypes, torch
    from vl.runtime.cpu import heap
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    kept = heap.keep_freed_memory()
    t = torch.ones(4 << 20)  # 16 MiB, pages written
    mapped = libc.mallinfo2().hblkhd
    del t
    print(kept, mapped >> 20, libc.mallinfo2().fordblks >> 20)
""")


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt / mallinfo2 are glibc's; other C libraries are left as they are")
@pytest.mark.parametrize("env, kept", [("1", True), ("0", False)])
def test_a_freed_16_mib_block_stays_in_the_heap_only_when_kept(env, kept):
    """In a fresh process (the setting is process-wide): with the default glibc maps a 16 MiB block on its own
    and unmaps it when freed (its pages would fault again next time); kept, it comes from the heap and its 16 MiB
    stay there, free, for the next allocation. `VL_HEAP_KEEP=0` leaves glibc's defaults."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "VL_HEAP_KEEP": env}, check=True).stdout.split()
    was_kept, mapped_mib, free_mib = out[0] == "True", int(out[1]), int(out[2])
    assert was_kept is kept
    if kept:
        assert mapped_mib < 16 and free_mib >= 16
    else:
        assert mapped_mib >= 16 and free_mib < 16
