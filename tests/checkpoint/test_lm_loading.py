"""Strict loading of Nemotron-H checkpoints: layouts, config aliases, and every bad-checkpoint row we own
(docs/reliability_policy.md §6.4: C1, C3, C3b, C4-C8, C10)."""

import json
import pickle
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

import vl
from tiny_models import save_hf_nemotron
from vl.checkpoint.files import save_tensors
from vl.config import lm_config_from_hf, lm_config_to_hf
from vl.errors import CheckpointError, ConfigError, UnsafeCheckpointError


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path, ref = save_hf_nemotron(tmp_path_factory.mktemp("good"), "moe")
    return path, ref


def copy(good, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(good[0], dst)
    return dst


def edit_tensors(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_transformers_in_memory_layout_loads_too(good, tmp_path):
    """`model.` prefix and fused (E, out, in) experts, as transformers holds them in memory."""
    path, ref = good
    dst = copy(good, tmp_path)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, dst / "model.safetensors")
    ours = vl.load_pretrained(dst)
    x = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        assert (ours(x).logits - ref(x).logits).abs().max() <= 1e-4


def test_sharded_checkpoint_loads(good, tmp_path):
    path, ref = good
    dst = tmp_path / "sharded"
    dst.mkdir()
    shutil.copy(path / "config.json", dst)
    save_tensors(load_file(path / "model.safetensors"), dst, max_shard_bytes=20_000)
    assert len(list(dst.glob("model-*.safetensors"))) > 2
    ours = vl.load_pretrained(dst)
    x = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        assert (ours(x).logits - ref(x).logits).abs().max() <= 1e-4


def test_loading_twice_changes_nothing(good):
    a, b = vl.load_pretrained(good[0]), vl.load_pretrained(good[0])
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


def test_missing_tensor_is_named(good, tmp_path):
    dst = copy(good, tmp_path)
    edit_tensors(dst, lambda t: t.pop("backbone.layers.0.mixer.A_log"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'backbone.layers.0.mixer.A_log'"):
        vl.load_pretrained(dst)


def test_missing_expert_is_refused(good, tmp_path):
    dst = copy(good, tmp_path)
    edit_tensors(dst, lambda t: t.pop("backbone.layers.1.mixer.experts.3.up_proj.weight"))
    with pytest.raises(CheckpointError, match="expert indices"):
        vl.load_pretrained(dst)


def test_wrong_shape_is_named(good, tmp_path):
    dst = copy(good, tmp_path)
    edit_tensors(dst, lambda t: t.__setitem__("backbone.norm_f.weight", torch.ones(65)))
    with pytest.raises(CheckpointError, match=r"'backbone.norm_f.weight': expected shape \[64\], found \[65\]"):
        vl.load_pretrained(dst)


def test_unexpected_tensor_is_refused(good, tmp_path):
    dst = copy(good, tmp_path)
    edit_tensors(dst, lambda t: t.__setitem__("backbone.layers.0.mixer.extra", torch.ones(3)))
    with pytest.raises(CheckpointError, match="unexpected tensor.*backbone.layers.0.mixer.extra"):
        vl.load_pretrained(dst)


def test_wrong_dtype_is_refused(good, tmp_path):
    dst = copy(good, tmp_path)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(cfg))
    edit_tensors(dst, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}) or
                 t.__setitem__("lm_head.weight", t["lm_head.weight"].half()))
    with pytest.raises(CheckpointError, match=r"'lm_head.weight': expected torch.bfloat16.*found torch.float16"):
        vl.load_pretrained(dst)
    edit_tensors(dst, lambda t: t.__setitem__("lm_head.weight", t["lm_head.weight"].to(torch.int32)))
    with pytest.raises(CheckpointError, match="expected a floating dtype, found torch.int32"):
        vl.load_pretrained(dst)


def test_nan_scan_is_opt_in(good, tmp_path):
    dst = copy(good, tmp_path)
    edit_tensors(dst, lambda t: t["backbone.layers.2.mixer.q_proj.weight"].view(-1).__setitem__(5, float("nan")))
    vl.load_pretrained(dst)  # off by default: loading stays a single pass
    with pytest.raises(CheckpointError, match="q_proj.weight' contains NaN"):
        vl.load_pretrained(dst, scan_nan=True)


def test_truncated_safetensors(good, tmp_path):
    dst = copy(good, tmp_path)
    f = dst / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        vl.load_pretrained(dst)
    f.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="too short"):
        vl.load_pretrained(dst)


def _write_raw(path, header: dict | bytes, data: bytes, claimed=None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", claimed if claimed is not None else len(raw)) + raw + data)


@pytest.mark.parametrize("case", ["huge_header", "header_past_eof", "overlap", "gap", "size_mismatch", "duplicate"])
def test_malformed_headers_fail_fast(good, tmp_path, case):
    dst = copy(good, tmp_path)
    f = dst / "model.safetensors"
    a = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    if case == "huge_header":
        _write_raw(f, b"{}", b"", claimed=150 * 1024 * 1024)
        match = "over the"
    elif case == "header_past_eof":
        _write_raw(f, b"{}", b"", claimed=10_000)
        match = "truncated"
    elif case == "overlap":
        _write_raw(f, {"a": a, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12))
        match = "overlaps"
    elif case == "gap":
        _write_raw(f, {"a": a, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, bytes(16))
        match = "gap"
    elif case == "size_mismatch":
        _write_raw(f, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8))
        match = "needs 12 bytes"
    else:
        _write_raw(f, b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                      b'"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', bytes(8))
        match = "appears twice"
    with pytest.raises(CheckpointError, match=match):
        vl.load_pretrained(dst)


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickle_only_checkpoint_is_refused_never_unpickled(good, tmp_path):
    dst = copy(good, tmp_path)
    (dst / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    (dst / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(str(marker))))
    with pytest.raises(UnsafeCheckpointError, match="never unpickled"):
        vl.load_pretrained(dst)
    assert not marker.exists()


def test_pickle_beside_safetensors_is_never_opened(good, tmp_path):
    dst = copy(good, tmp_path)
    marker = tmp_path / "pwned"
    (dst / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(str(marker))))
    vl.load_pretrained(dst)
    assert not marker.exists()


def test_sharded_index_errors_name_the_shard(good, tmp_path):
    path, _ = good
    dst = tmp_path / "sharded"
    dst.mkdir()
    shutil.copy(path / "config.json", dst)
    save_tensors(load_file(path / "model.safetensors"), dst, max_shard_bytes=20_000)
    victim = sorted(dst.glob("model-*.safetensors"))[1]
    data = victim.read_bytes()
    victim.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=victim.name):
        vl.load_pretrained(dst)
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"shard {victim.name} is listed but missing"):
        vl.load_pretrained(dst)


def test_unknown_architecture_with_auto_map_is_refused_without_running_code(tmp_path):
    marker = tmp_path / "pwned"
    d = tmp_path / "evil"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {"AutoModel": "modeling_evil.M"}}))
    (d / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    with pytest.raises(UnsafeCheckpointError, match="remote code is never executed"):
        vl.load_pretrained(d)
    assert not marker.exists()


# --- config adapter -------------------------------------------------------------------------------

def test_config_aliases_map_to_the_same_model():
    base = {"model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 100, "num_attention_heads": 4,
            "num_key_value_heads": 2, "mamba_num_heads": 8, "mamba_head_dim": 8}
    a = lm_config_from_hf({**base, "hybrid_override_pattern": "M*-", "n_groups": 2, "conv_kernel": 3,
                           "chunk_size": 64, "head_dim": 16, "layer_norm_epsilon": 1e-6,
                           "time_step_limit": [0.0, {"__float__": "Infinity"}]})
    b = lm_config_from_hf({**base, "layers_block_type": ["mamba", "attention", "mlp"], "mamba_n_groups": 2,
                           "mamba_d_conv": 3, "mamba_chunk_size": 64, "attention_head_dim": 16,
                           "rms_norm_eps": 1e-6, "mamba_dt_limit": [0.0, float("inf")]})
    c = lm_config_from_hf({**base, "layers_block_type": ["linear_attention", "full_attention", "mlp"],
                           "n_groups": 2, "conv_kernel": 3, "chunk_size": 64, "head_dim": 16,
                           "layer_norm_epsilon": 1e-6, "num_hidden_layers": 3})
    assert a == b == c
    assert a.pattern == "M*-" and a.time_step_limit == (0.0, float("inf"))


def test_config_moe_keys_and_round_trip():
    import transformers

    hf = transformers.NemotronHConfig(hybrid_override_pattern="ME*", hidden_size=32, moe_latent_size=16,
                                      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                                      moe_shared_expert_intermediate_size=8)
    cfg = lm_config_from_hf(hf.to_dict())
    assert (cfg.moe_latent_size, cfg.n_routed_experts, cfg.pattern) == (16, 4, "ME*")
    assert lm_config_from_hf(lm_config_to_hf(cfg)) == cfg
    back = transformers.NemotronHConfig(**lm_config_to_hf(cfg))
    assert back.hybrid_override_pattern == "ME*" and back.moe_latent_size == 16


def test_unknown_config_key_is_a_warning_not_silence(caplog):
    with caplog.at_level("WARNING", logger="vl.config"):
        cfg = lm_config_from_hf({"hybrid_override_pattern": "M", "mystery_knob": 3})
    assert cfg.pattern == "M"
    assert any("unknown Nemotron-H config keys ['mystery_knob']" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match="num_hidden_layers=4 but the layer pattern has 2"):
        lm_config_from_hf({"hybrid_override_pattern": "M*", "num_hidden_layers": 4})
    with pytest.raises(ConfigError, match="layer pattern"):
        lm_config_from_hf({"hybrid_override_pattern": "MX"})


def test_saved_files_are_byte_stable_across_processes(tmp_path):
    """safetensors writes `__metadata__` in hash-map order, which changes per process; save_tensors sorts it,
    so equal tensors and metadata give equal bytes (exports can be checksummed)."""
    import subprocess
    import sys

    script = ("import sys, torch; from vl.checkpoint.files import save_tensors; "
              "save_tensors({'w': torch.arange(6.).reshape(2, 3), 'b': torch.ones(2, dtype=torch.bfloat16)}, "
              "sys.argv[1], metadata={'vl_quantize': 'fp8', 'zeta': '1', 'alpha': '2'})")
    files = []
    for k in range(3):  # three processes: unsorted, 4 keys in the same order thrice has odds (1/24)^2
        subprocess.run([sys.executable, "-c", script, str(tmp_path / str(k))], check=True)
        files.append((tmp_path / str(k) / "model.safetensors").read_bytes())
    assert len(set(files)) == 1
    (n,) = struct.unpack("<Q", files[0][:8])
    header = json.loads(files[0][8:8 + n])
    assert list(header["__metadata__"]) == ["alpha", "format", "vl_quantize", "zeta"]
    loaded = load_file(tmp_path / "0" / "model.safetensors")
    assert torch.equal(loaded["w"], torch.arange(6.).reshape(2, 3)) and loaded["b"].dtype == torch.bfloat16
