"""Checkpoint rows of docs/reliability_policy.md §6.4 not covered elsewhere, on the VL layout: C2 (a static scan:
no unsafe deserialisation anywhere in the product, no `trust_remote_code`, no `ignore_mismatched_sizes`), C3 timing and memory (malformed headers fail in well under
a second without allocating the claimed sizes), C5 (the unexpected-tensor allowlist), C8 (NaN / Inf in a vision
or projector weight), C10 (a sharded VL checkpoint with a missing or truncated shard).

The LM-side versions of C1, C3, C3b, C4-C8 and C10 are in tests/checkpoint/test_lm_loading.py; C4, C6 and C9 on
the VL layout in tests/modeling/test_vlm.py; C7 for FP8/NVFP4 in tests/quant/.
"""

from __future__ import annotations

import ast
import json
import pickle
import shutil
import struct
import tracemalloc
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file

import vl
from vl.checkpoint.files import CheckpointFiles, save_tensors
from vl.checkpoint.nano_vl import save_pretrained
from vl.config import tiny_vl
from vl.errors import CheckpointError
from vl.modeling.vlm import NemotronVL

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ["vl", "ui", "eval", "data_recipes", "token_reduction", "scripts"]
# pickle is read only from our own child processes over a socketpair (never from a file or the network);
# SECURITY.md states what that means for a compromised decoder
PICKLE_ALLOWED = {"vl/processing/sandbox.py", "eval/backend.py"}


@pytest.fixture(scope="module")
def saved_vl(tmp_path_factory):
    torch.manual_seed(0)
    return save_pretrained(NemotronVL(tiny_vl()).eval(), tmp_path_factory.mktemp("vl") / "tiny")


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit(path: Path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


# --- C2: no unsafe deserialisation in the product -----------------------------------------------------------
def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = (f"{f.value.id}.{f.attr}" if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                    else f.id if isinstance(f, ast.Name) else None)
            yield name, node


def test_c2_every_torch_load_is_weights_only_and_pickle_is_confined():
    sources = [p for d in PRODUCT for p in (REPO / d).rglob("*.py")]
    assert len(sources) > 50, "the scan must see the product's sources"
    torch_loads, pickle_loads, unsafe = [], [], []
    for path in sources:
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for name, node in _calls(tree):
            if name == "torch.load":
                kw = {k.arg: k.value for k in node.keywords}
                ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                torch_loads.append((rel, node.lineno, ok))
            if name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load", "dill.loads",
                        "cloudpickle.load", "cloudpickle.loads", "joblib.load", "numpy.load", "np.load"):
                pickle_loads.append((rel, node.lineno, name))
            for k in node.keywords:
                if k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is False:
                    unsafe.append((rel, node.lineno))
                if k.arg == "allow_pickle" and isinstance(k.value, ast.Constant) and k.value.value is True:
                    unsafe.append((rel, node.lineno))
                if k.arg == "trust_remote_code" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                    unsafe.append((rel, node.lineno))
                if k.arg == "ignore_mismatched_sizes":  # matrix C6: a mismatch is never silently re-initialised
                    unsafe.append((rel, node.lineno))
    assert not unsafe, f"weights_only=False / allow_pickle=True / trust_remote_code / ignore_mismatched_sizes: {unsafe}"
    assert all(ok for _, _, ok in torch_loads), f"torch.load without weights_only=True: {torch_loads}"
    outside = [p for p in pickle_loads if p[0] not in PICKLE_ALLOWED]
    assert not outside, f"unpickling outside the child-process channels: {outside}"
    assert {p[0] for p in pickle_loads} <= PICKLE_ALLOWED


def test_c2_weights_only_load_refuses_a_disallowed_global(tmp_path):
    """What the rule relies on: torch's weights_only unpickler refuses a global outside its allowlist."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"w": torch.ones(2), "x": Evil()}, f)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=True)
    assert not marker.exists()


# --- C3: malformed headers fail fast, without allocating what they claim -------------------------------------
def _write_raw(path: Path, header: bytes, data: bytes, claimed: int | None = None):
    path.write_bytes(struct.pack("<Q", len(header) if claimed is None else claimed) + header + data)


@pytest.mark.parametrize("case", ["claims_150MB_header", "header_past_eof", "overlap", "gap", "span_mismatch",
                                  "huge_shape", "duplicate"])
def test_c3_malformed_header_fails_without_allocating(tmp_path, case):
    f = tmp_path / "model.safetensors"
    a = b'{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
    if case == "claims_150MB_header":
        _write_raw(f, b"{}", b"", claimed=150 * 1024 * 1024)
    elif case == "header_past_eof":
        _write_raw(f, b"{}", bytes(16), claimed=10_000)
    elif case == "overlap":
        _write_raw(f, b'{"a": ' + a + b', "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}', bytes(12))
    elif case == "gap":
        _write_raw(f, b'{"a": ' + a + b', "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}', bytes(16))
    elif case == "span_mismatch":
        _write_raw(f, b'{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}', bytes(8))
    elif case == "huge_shape":  # 2^62 elements: the product must not be trusted or allocated
        _write_raw(f, b'{"a": {"dtype": "F32", "shape": [2147483648, 2147483648], "data_offsets": [0, 8]}}',
                   bytes(8))
    else:
        _write_raw(f, b'{"a": ' + a + b', "a": ' + a + b"}", bytes(8))
    rss = psutil.Process().memory_info().rss
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError):
            CheckpointFiles(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # fast = nothing of the claimed size allocated (Python objects, counted) or touched (the process's pages)
    assert peak < 20 << 20 and psutil.Process().memory_info().rss - rss < 20 << 20, peak


# --- C5: unexpected tensors fail unless on the allowlist ---------------------------------------------------
def test_c5_allowlisted_extras_load_and_others_are_refused(saved_vl, tmp_path):
    dst = _copy(saved_vl, tmp_path)
    _edit(dst, lambda t: t.update({"vision_model.radio_model.summary_idxs": torch.tensor([0, 1]),
                                   "vision_model.radio_model.adaptors.clip.fc.weight": torch.ones(2, 2)}))
    vl.load_pretrained(dst)  # documented, ignored with a reason
    for extra in ("vision_model.radio_model.model.blocks.0.extra", "mlp1.9.weight", "something_else"):
        _edit(dst, lambda t, k=extra: t.__setitem__(k, torch.ones(3)))
        with pytest.raises(CheckpointError, match=f"unexpected tensor.*{extra}"):
            vl.load_pretrained(dst)
        _edit(dst, lambda t, k=extra: t.pop(k))


# --- C8: NaN / Inf in one weight -------------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [
    ("vision_model.radio_model.model.blocks.5.attn.qkv.weight", float("nan")),
    ("mlp1.1.weight", float("inf")),
    ("language_model.backbone.layers.0.mixer.in_proj.weight", float("-inf")),
])
def test_c8_non_finite_weight_is_flagged_by_the_scan(saved_vl, tmp_path, key, value):
    dst = _copy(saved_vl, tmp_path)
    _edit(dst, lambda t: t[key].view(-1).__setitem__(7, value))
    model = vl.load_pretrained(dst)  # the scan is opt-in: loading stays a single pass by default
    assert not torch.isfinite(dict(model.named_parameters())[_native(key)]).all()
    with pytest.raises(CheckpointError, match=f"'{_native(key)}' contains NaN or Inf"):  # named as loaded
        vl.load_pretrained(dst, scan_nan=True)
    vl.load_pretrained(saved_vl, scan_nan=True)  # a clean checkpoint passes the scan


def _native(key: str) -> str:
    if key.startswith("vision_model.radio_model.model."):
        return "vision." + key[len("vision_model.radio_model.model."):]
    if key.startswith("mlp1."):
        return "projector." + key
    return key


# --- C10: sharded VL checkpoint ----------------------------------------------------------------------------
def test_c10_sharded_vl_missing_or_truncated_shard_is_named(saved_vl, tmp_path):
    dst = tmp_path / "sharded"
    dst.mkdir()
    shutil.copy(saved_vl / "config.json", dst)
    save_tensors(load_file(saved_vl / "model.safetensors"), dst, max_shard_bytes=400_000)
    shards = sorted(dst.glob("model-*.safetensors"))
    assert len(shards) >= 3
    vl.load_pretrained(dst)
    victim = shards[1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 64])
    with pytest.raises(CheckpointError, match=victim.name):
        vl.load_pretrained(dst)
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"shard {victim.name} is listed but missing"):
        vl.load_pretrained(dst)
    victim.write_bytes(data)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    moved = next(k for k, v in index["weight_map"].items() if v == shards[0].name)
    index["weight_map"][moved] = shards[2].name  # the index lies about where a tensor lives
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"tensor '{moved}' is in {shards[0].name} but the index says"):
        vl.load_pretrained(dst)
    index["weight_map"][moved] = "../outside.safetensors"
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="must be a plain file name"):
        vl.load_pretrained(dst)


def test_nan_scan_finds_a_nan_past_its_first_piece(monkeypatch):
    """The scan checks large tensors piece by piece (bounded temporaries at 12B size); a NaN in any piece,
    the last partial one included, is found and named."""
    from vl.checkpoint import files

    monkeypatch.setattr(files, "SCAN_CHUNK", 4)
    t = torch.zeros(3, 5, dtype=torch.bfloat16)  # 15 elements: pieces of 4, 4, 4, 3
    files.scan_non_finite({"ok": t.clone()})
    t.view(-1)[13] = float("inf")
    with pytest.raises(CheckpointError, match="'w' contains NaN or Inf"):
        files.scan_non_finite({"w": t})
