"""vl/runtime/cpu/hugepages.py: large CPU weights moved onto 2 MiB pages in place -- same pointers, same bytes, same
outputs -- where the kernel allows it; nothing happens with VL_HUGEPAGES=0 or for small tensors."""

import gc
import platform

import pytest
import torch

from vl.config import LMConfig
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.runtime.cpu import hugepages
from vl.runtime.pretrained import runtime_passes

pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="transparent huge pages are a Linux feature")


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text[text.index("[") + 1:text.index("]")]


def lm():
    """Embedding and LM head of 8 MiB each in fp32: whole 2 MiB pages inside them."""
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=4096, hidden_size=512, pattern="M*-", num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, intermediate_size=256, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
                   ssm_state_size=16, chunk_size=16)
    return NemotronHForCausalLM(cfg).eval()


def test_large_weights_move_to_huge_pages_with_the_same_bytes_and_outputs(monkeypatch):
    if _thp_mode() == "never" or _thp_mode() == "absent":
        pytest.skip(f"transparent huge pages are {_thp_mode()} on this machine")
    monkeypatch.setenv("VL_HUGEPAGES", "1")
    model = lm()
    ids = torch.randint(0, 4096, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
    emb = model.backbone.embeddings.weight
    before, ptr = emb.detach().clone(), emb.data_ptr()
    done = hugepages.advise(model)
    if done == 0:
        pytest.skip("the kernel declined MADV_COLLAPSE here (older than Linux 6.1, or THP restricted)")
    assert done >= 2 * hugepages.HUGE
    assert emb.data_ptr() == ptr and torch.equal(emb, before)
    assert hugepages.huge_bytes(emb) >= hugepages.HUGE
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    ptrs = [t.data_ptr() for t in model.parameters()]
    hugepages.advise(model)  # again: nothing moves a second time
    assert [t.data_ptr() for t in model.parameters()] == ptrs


def test_small_tensors_move_into_one_arena_and_shared_ones_stay_shared(monkeypatch):
    if _thp_mode() in ("never", "absent"):
        pytest.skip(f"transparent huge pages are {_thp_mode()} on this machine")
    monkeypatch.setenv("VL_HUGEPAGES", "1")
    model = lm()
    base = torch.randn(2, 300_000)  # two buffers that are views of one storage, on another module
    holder = model.backbone.layers[0]
    holder.register_buffer("a", base[0], persistent=False)
    holder.register_buffer("b", base[1], persistent=False)
    small = [n for n, p in model.named_parameters() if 64 << 10 <= p.untyped_storage().nbytes() < 8 << 20]
    assert small  # the projections of this model: 64 KiB .. 8 MiB
    ids = torch.randint(0, 4096, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    old_ptr = dict((n, p.data_ptr()) for n, p in model.named_parameters())
    if hugepages.advise(model) == 0:
        pytest.skip("the kernel declined MADV_COLLAPSE here (older than Linux 6.1, or THP restricted)")
    params = dict(model.named_parameters())
    moved = [params[n].data_ptr() != old_ptr[n] for n in small]
    if not any(moved):  # the large embedding collapsed in place, but no huge page came for the arena
        assert all(torch.equal(params[n], before[n]) for n in params)  # left exactly where and as they were
        pytest.skip("the kernel gave the arena no huge pages here (memory too fragmented to collapse into)")
    assert all(moved)  # moved, all together ...
    assert all(torch.equal(params[n], before[n]) for n in params)  # ... with their values
    assert holder.a.untyped_storage().data_ptr() == holder.b.untyped_storage().data_ptr()  # still one storage
    assert torch.equal(holder.a, base[0]) and torch.equal(holder.b, base[1])
    assert hugepages.huge_bytes(params[small[0]]) >= hugepages.HUGE
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_switched_off_or_small_tensors_do_nothing(monkeypatch):
    monkeypatch.setenv("VL_HUGEPAGES", "0")
    assert hugepages.advise(lm()) == 0
    monkeypatch.setenv("VL_HUGEPAGES", "1")
    small = torch.nn.Linear(64, 64)  # 16 KiB: no whole 2 MiB page inside
    assert hugepages.advise(small) == 0


def test_the_load_passes_ask_for_huge_pages(monkeypatch):
    calls = []
    monkeypatch.setattr(hugepages, "advise", lambda m: calls.append(m) or 0)
    model = lm()
    assert runtime_passes(model) is model and calls == [model]


def test_a_refusing_kernel_leaves_every_tensor_where_it_was(monkeypatch):
    class Refuses:  # madvise that always fails, as on a kernel without THP or MADV_COLLAPSE
        @staticmethod
        def madvise(addr, n, advice):
            return -1

    monkeypatch.setenv("VL_HUGEPAGES", "1")
    monkeypatch.setattr(hugepages, "_libc", lambda: Refuses)
    monkeypatch.setattr(hugepages, "_any_huge", lambda t: False)
    model = lm()
    old = {n: (p.data_ptr(), p.detach().clone()) for n, p in model.named_parameters()}
    assert hugepages.advise(model) == 0
    assert all(p.data_ptr() == old[n][0] and torch.equal(p, old[n][1]) for n, p in model.named_parameters())


def test_file_mapped_weights_are_left_alone(monkeypatch, tmp_path):
    """A tensor over a file map (the loader's mapped embedding) gets no huge-page advice: khugepaged would read the
    whole file range in, where decode reads a few rows."""
    import mmap

    monkeypatch.setenv("VL_HUGEPAGES", "1")
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(16 << 20))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 16 << 20, access=mmap.ACCESS_COPY)
    holder = torch.nn.Module()
    holder.register_buffer("mapped", torch.frombuffer(m, dtype=torch.float32))
    holder.register_buffer("own", torch.zeros(4 << 20))
    seen = []
    monkeypatch.setattr(hugepages, "advise_range", lambda addr, n: seen.append(addr) or 0)
    hugepages.advise(holder)
    assert seen == [holder.own.data_ptr()]


def test_a_freed_arena_is_forgotten(monkeypatch):
    """Memory of a freed model's arena that a new model's weights reuse is moved like any other: the record of
    arenas holds their storages weakly (a stale address range left a later model's small tensors unmoved)."""
    if _thp_mode() in ("never", "absent"):
        pytest.skip(f"transparent huge pages are {_thp_mode()} on this machine")
    monkeypatch.setenv("VL_HUGEPAGES", "1")
    model = lm()
    before = {id(st) for st in hugepages._ARENAS}  # other tests' models (still alive) may hold arenas too
    if hugepages.advise(model) == 0 or not [st for st in hugepages._ARENAS if id(st) not in before]:
        pytest.skip("the kernel gave no arena huge pages here")
    arena = next(st for st in hugepages._ARENAS if id(st) not in before)
    start, end = arena.data_ptr(), arena.data_ptr() + arena.nbytes()
    assert hugepages._in_huge(start)
    del model, arena
    gc.collect()
    assert not hugepages._in_huge(start) and not hugepages._in_huge(end - 1)


def test_weights_read_from_a_checkpoint_move_to_huge_pages_and_mapped_tables_do_not(tmp_path, monkeypatch):
    """The loader's reads leave the storage torch's own (a `.numpy()` view once marked it foreign, and no loaded
    checkpoint weight got huge pages); its mapped embedding tables stay as they are."""
    if _thp_mode() in ("never", "absent"):
        pytest.skip(f"transparent huge pages are {_thp_mode()} on this machine")
    from safetensors.torch import save_file

    from vl.checkpoint.files import CheckpointFiles

    monkeypatch.setenv("VL_HUGEPAGES", "1")
    save_file({"w": torch.randn(4096, 1024), "emb": torch.randn(4096, 1024)}, str(tmp_path / "model.safetensors"))
    loaded = CheckpointFiles(tmp_path).load_all(mapped={"emb"})
    w, emb = loaded["w"], loaded["emb"]
    assert w.untyped_storage().resizable() and not emb.untyped_storage().resizable()
    model = torch.nn.Module()
    model.lin = torch.nn.Linear(1024, 4096, bias=False)
    model.lin.weight.data = w
    model.emb = torch.nn.Embedding(4096, 1024, _weight=emb)
    want = w.clone()
    if hugepages.advise(model) == 0:
        pytest.skip("the kernel declined MADV_COLLAPSE here (older than Linux 6.1, or THP restricted)")
    assert hugepages.huge_bytes(model.lin.weight) >= hugepages.HUGE and torch.equal(model.lin.weight, want)
    assert hugepages.huge_bytes(model.emb.weight) == 0


def small_linears(monkeypatch, arena_mib: int, count: int, in_features: int) -> torch.nn.Module:
    """`count` bias-free Linear(in_features, 512) weights in fp32, all under the in-place size, with huge pages on
    and arenas of `arena_mib` MiB (skips where THP is off)."""
    if _thp_mode() in ("never", "absent"):
        pytest.skip(f"transparent huge pages are {_thp_mode()} on this machine")
    monkeypatch.setenv("VL_HUGEPAGES", "1")
    monkeypatch.setattr(hugepages, "ARENA_BYTES", arena_mib << 20)
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(in_features, 512, bias=False) for _ in range(count)])


def test_small_tensors_go_into_arenas_of_bounded_size(monkeypatch):
    """A model with more small weights than one arena holds (a MoE's packed experts) is moved one bounded arena at
    a time: several arenas, the same values and outputs."""
    model = small_linears(monkeypatch, arena_mib=4, count=20, in_features=512)  # 1 MiB each
    x = torch.randn(3, 512)
    with torch.no_grad():
        want = model(x)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    old = {id(st) for st in hugepages._ARENAS}
    if hugepages.advise(model) == 0:
        pytest.skip("the kernel declined MADV_COLLAPSE here (older than Linux 6.1, or THP restricted)")
    new = [st for st in hugepages._ARENAS if id(st) not in old]
    assert len(new) >= 4  # 20 MiB in arenas of at most 4 MiB
    assert all(st.nbytes() <= hugepages.ARENA_BYTES + hugepages.HUGE for st in new)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    with torch.no_grad():
        assert torch.equal(model(x), want)


def test_each_arenas_originals_are_freed_before_the_next_arena(monkeypatch):
    """The move holds no storage between arenas: after each arena the process holds about one arena more than the
    model, not the copies of every arena so far beside all the originals (a 30B MoE's 16 GB of packed experts were
    twice in memory at load, and the kernel killed the process)."""
    import psutil

    model = small_linears(monkeypatch, arena_mib=8, count=64, in_features=1024)  # 2 MiB each
    gc.collect()
    proc = psutil.Process()
    base, after = proc.memory_info().rss, []
    trim = hugepages.trim_heap
    monkeypatch.setattr(hugepages, "trim_heap", lambda: (trim(), after.append(proc.memory_info().rss - base)))
    if hugepages.advise(model) == 0:
        pytest.skip("the kernel declined MADV_COLLAPSE here (older than Linux 6.1, or THP restricted)")
    assert len(after) >= 16
    assert max(after) < 40 << 20, [a >> 20 for a in after]  # all 16 arenas' copies kept with originals: +128 MiB
