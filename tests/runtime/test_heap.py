"""vl/runtime/heap.py at load time: every load gives the heap's free pages back (the call itself is tested in
tests/ui/test_ui_heap.py)."""

from vl.runtime import heap


def test_every_load_trims_the_heap(monkeypatch, tmp_path):
    import vl
    from tiny_models import save_hf_nemotron

    path, _ = save_hf_nemotron(tmp_path, "hybrid")
    calls = []
    monkeypatch.setattr(heap, "trim_heap", lambda: calls.append(1) or True)
    vl.load_pretrained(path)
    assert calls == [1]
