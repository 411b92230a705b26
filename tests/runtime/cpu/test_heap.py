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


# A fresh process's heap as glibc reports it (`mallinfo2`: hblkhd = bytes in mapped blocks, fordblks = free bytes
# kept in the heap), after `keep_freed_memory()`.
_SETUP = textwrap.dedent("""
    import ctypes, threading, torch
    from vl.runtime.cpu import heap
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    kept = heap.keep_freed_memory()
""")

_PROBE = _SETUP + textwrap.dedent("""
    t = torch.ones(MIB << 18)  # MIB MiB, pages written
    mapped = libc.mallinfo2().hblkhd
    del t
    print(kept, mapped >> 20, libc.mallinfo2().fordblks >> 20)
""")

# A block of a 12B layer's size allocated on another thread (a server's or the app's worker): past what a thread's
# own arena could hold (64 MiB), it comes from the one arena the setting leaves, and stays there when freed.
_THREADED = _SETUP + textwrap.dedent("""
    out = []
    def work():
        for _ in range(2):
            t = torch.ones(64 << 20)  # 256 MiB
            out.append((float(t[-1]), libc.mallinfo2().hblkhd >> 20))
            del t
        out.append(libc.mallinfo2().fordblks >> 20)
    th = threading.Thread(target=work)
    th.start()
    th.join()
    print(kept, out[0][0] + out[1][0], max(out[0][1], out[1][1]), out[2])
""")


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt / mallinfo2 are glibc's; other C libraries are left as they are")
@pytest.mark.parametrize("env, kept", [("1", True), ("0", False)])
@pytest.mark.parametrize("mib", [16, 256])
def test_a_freed_block_stays_in_the_heap_only_when_kept(env, kept, mib):
    """In a fresh process (the setting is process-wide): with the default glibc maps a 16 MiB block on its own
    and unmaps it when freed (its pages would fault again next time); kept, it comes from the heap and its MiB
    stay there, free, for the next allocation, also past glibc's largest mmap threshold (32 MiB; a 12B layer's
    temporaries at a page's tokens). `VL_HEAP_KEEP=0` leaves glibc's defaults."""
    out = subprocess.run([sys.executable, "-c", _PROBE.replace("MIB", str(mib))], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "VL_HEAP_KEEP": env}, check=True).stdout.split()
    was_kept, mapped_mib, free_mib = out[0] == "True", int(out[1]), int(out[2])
    assert was_kept is kept
    if kept:
        assert mapped_mib < mib and free_mib >= mib
    else:
        assert mapped_mib >= mib and free_mib < mib


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt / mallinfo2 are glibc's; other C libraries are left as they are")
def test_a_thread_keeps_a_freed_256_mib_block_in_the_one_arena():
    out = subprocess.run([sys.executable, "-c", _THREADED], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "VL_HEAP_KEEP": "1"}, check=True).stdout.split()
    kept, ones, mapped_mib, free_mib = out[0] == "True", float(out[1]), int(out[2]), int(out[3])
    assert kept and ones == 2.0  # both allocations succeeded and hold what was written
    assert mapped_mib < 256 and free_mib >= 256


def test_the_vl_command_shares_one_arena_before_its_command_runs(monkeypatch):
    """`vl COMMAND` sets the one arena before the command's module is imported or run, so every thread the command
    starts (a server's worker, the app's handlers) allocates from it."""
    import vl.cli as cli

    order = []
    monkeypatch.setattr(heap, "share_one_arena", lambda: order.append("arena") or True)
    monkeypatch.setitem(cli.COMMANDS, "probe", ("operator:truth", "a probe"))
    real = cli.importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: order.append(name) or real(name))
    assert cli.main(["probe"]) == 0
    assert order[:2] == ["arena", "operator"]
