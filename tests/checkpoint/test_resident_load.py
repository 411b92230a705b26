"""Loaded tensors live in process memory, not in the file's memory map (vl/checkpoint/files.py): the same bytes
and bit-for-bit the same logits as the mapped load, for plain, FP8 and NVFP4 checkpoints; only the embedding
table stays mapped (a forward reads a few of its rows)."""

import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import vl
from tiny_models import save_hf_nemotron
from vl.bench import geometry as bench_geometry
from vl.checkpoint import files as ckfiles
from vl.config import nano_12b_lm
from vl.errors import CheckpointError

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps (Linux)")


def mapping_of(t: torch.Tensor) -> str:
    """The /proc/self/maps path of the mapping that holds t's first byte ('' for anonymous memory)."""
    addr = t.data_ptr()
    for line in open("/proc/self/maps"):
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5].strip() if len(parts) > 5 else ""
    raise AssertionError(f"address {addr:#x} is in no mapping")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def small_lm():
    return nano_12b_lm(hidden_size=256, intermediate_size=512, mamba_num_heads=8, mamba_head_dim=32,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512, pattern="M-*-")


def test_read_gives_the_files_bytes_for_every_dtype(tmp_path):
    tensors = {
        "bf16": torch.randn(5, 7).bfloat16(), "f32": torch.randn(3), "f16": torch.randn(2, 2).half(),
        "f8": torch.randn(4, 8).to(torch.float8_e4m3fn), "u8": torch.randint(0, 256, (9,), dtype=torch.uint8),
        "i64": torch.arange(-3, 3), "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(0.25),
        "empty": torch.empty(0, 4),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    files = ckfiles.CheckpointFiles(tmp_path)
    got, ref = files.load_all(), load_file(str(tmp_path / "model.safetensors"))
    assert set(got) == set(tensors)
    for name, t in got.items():
        assert t.dtype == ref[name].dtype and t.shape == ref[name].shape, name
        assert torch.equal(as_bytes(t), as_bytes(ref[name])), name
    assert torch.equal(files.get("scalar"), torch.tensor(0.25))


class ShortReads:
    """A file whose readinto returns at most 7 bytes, as a read() past ~2 GiB returns less than asked."""

    def __init__(self, f):
        self.f = f

    def seek(self, pos):
        self.f.seek(pos)

    def readinto(self, buf):
        return self.f.readinto(buf[:7])


def test_short_reads_are_continued_and_a_truncated_file_is_an_error(tmp_path):
    t = torch.randn(33, 5)
    save_file({"w": t}, str(tmp_path / "model.safetensors"))
    files = ckfiles.CheckpointFiles(tmp_path)
    with open(tmp_path / "model.safetensors", "rb", buffering=0) as f:
        assert torch.equal(ckfiles._read_tensor(ShortReads(f), files.infos["w"]), t)
    with open(tmp_path / "model.safetensors", "r+b") as f:  # the file shrinks after its header was checked
        f.truncate(files.infos["w"].offset + 100)
    with pytest.raises(CheckpointError, match="'w' ends past the end of the file"):
        files.load_all()


def load_both(path, monkeypatch):
    """(model loaded as now, model loaded with every tensor a view of the file's map, as before)."""
    new = vl.load_pretrained(path, dtype=torch.bfloat16)
    with monkeypatch.context() as m:
        m.setattr(ckfiles, "READ_INTO_MEMORY", False)
        old = vl.load_pretrained(path, dtype=torch.bfloat16)
    return new, old


@linux_only
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_weights_are_in_process_memory_and_logits_are_bit_for_bit_the_mapped_loads(tmp_path, monkeypatch, fmt):
    if fmt == "bf16":
        path, _ = save_hf_nemotron(tmp_path, "hybrid", dtype=torch.bfloat16)
    else:
        path = bench_geometry.write_random_checkpoint(small_lm(), fmt, tmp_path / "m")
    new, old = load_both(path, monkeypatch)
    emb = "backbone.embeddings.weight"
    new_sd, old_sd = new.state_dict(), old.state_dict()
    assert new_sd.keys() == old_sd.keys()
    for name, t in new_sd.items():
        assert t.dtype == old_sd[name].dtype and torch.equal(as_bytes(t), as_bytes(old_sd[name])), name
        where = mapping_of(t)
        if name == emb:
            assert where.endswith("model.safetensors"), where  # rows read on demand from the page cache
        else:
            assert not where.endswith(".safetensors"), f"{name} is still a view of {where}"
    assert mapping_of(old_sd["lm_head.weight"]).endswith("model.safetensors")  # the test sees the difference
    ids = torch.randint(3, new.config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(new(ids).logits, old(ids).logits)
        assert torch.equal(new(ids[:, :1]).logits, old(ids[:, :1]).logits)  # a decode-sized call too


def test_a_tied_embedding_is_read_whole(tmp_path):
    from torch import nn

    from vl.checkpoint.adapter import row_tables

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.other = nn.Embedding(10, 4), nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

    assert row_tables(Tied()) == {"other.weight"}


def test_a_mapped_tensor_is_copy_on_write(tmp_path):
    t = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    save_file({"a": torch.ones(3), "w": t}, str(tmp_path / "model.safetensors"))
    before = (tmp_path / "model.safetensors").read_bytes()
    got = ckfiles.CheckpointFiles(tmp_path).load_all(mapped={"w"})
    assert torch.equal(got["w"], t) and torch.equal(got["a"], torch.ones(3))
    got["w"][5] = -1.0  # a private copy of the page: the file keeps its bytes
    assert (tmp_path / "model.safetensors").read_bytes() == before


def test_a_misaligned_tensor_asked_mapped_is_read(tmp_path):
    """The format allows a float32 tensor at an odd offset; it cannot be a view of the map, so it is read."""
    import json
    import struct

    w = torch.arange(6, dtype=torch.float32)
    header = {"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "w": {"dtype": "F32", "shape": [6], "data_offsets": [1, 25]}}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + b"\x07" + w.numpy().tobytes())
    files = ckfiles.CheckpointFiles(tmp_path)
    got = files.load_all(mapped={"w"})
    assert torch.equal(got["w"], w) and int(got["b"]) == 7
    if sys.platform.startswith("linux"):
        assert not mapping_of(got["w"]).endswith(".safetensors")
