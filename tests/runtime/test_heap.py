"""vl/runtime/heap.py: free pages inside the C heap go back to the OS, and every load asks for it."""

import platform

import pytest
import torch

from vl.runtime import heap


def _anon() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(platform.system() != "Linux" or heap._trim_fn() is None,
                    reason="malloc_trim is glibc's (Linux); elsewhere trim() does nothing by design")
def test_trim_returns_freed_pages_inside_the_heap():
    # 100 KiB tensors sit below glibc's mmap threshold, so they come from the heap; freeing every other one
    # leaves holes that a plain free() keeps resident
    kept, freed = [], []
    for i in range(400):
        (kept if i % 2 else freed).append(torch.ones(25_600))  # 100 KiB, pages touched
    freed_bytes = sum(t.nbytes for t in freed)
    heap.trim()
    del freed
    before = _anon()
    assert heap.trim()
    after = _anon()
    assert before - after > freed_bytes // 2, (before, after, freed_bytes)
    assert all(bool((t == 1).all()) for t in kept)  # what is still in use is untouched


def test_every_load_trims_the_heap(monkeypatch, tmp_path):
    import vl
    from tiny_models import save_hf_nemotron

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    calls = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1) or True)
    vl.load_pretrained(path)
    assert calls == [1]
