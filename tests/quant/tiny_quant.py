"""Shared tiny checkpoints for the quantized-loading and `vl quantize` tests: built once per pytest session
under the session's base temp dir (the tiny VL model takes seconds to build), read-only for the tests."""

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tiny_models import make_tiny_vl_dir


def shared_dir(tmp_path_factory, name: str, build) -> Path:
    path = tmp_path_factory.getbasetemp() / f"shared_{name}"
    if not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        build(path)
    return path


def tiny_vl(tmp_path_factory) -> Path:
    return shared_dir(tmp_path_factory, "tiny_vl", lambda p: make_tiny_vl_dir(p, seed=0))


def quantized(tmp_path_factory, fmt: str, *extra: str) -> Path:
    """The tiny VL model exported by the `vl quantize` command line."""
    from vl.quantize.cli import main

    src = tiny_vl(tmp_path_factory)
    name = f"tiny_vl_{fmt}" + "".join(e.strip("-").replace("-", "_") for e in extra)

    def build(out):
        # text prompts keep these exports free of the video decoders; the synthetic media path is tested in
        # test_quantize_cli.py
        prompts = out.parent / f"{name}_prompts.txt"
        prompts.write_text("What is the total? The total is 47.\nThe red circle moves to the right.\n")
        rc = main(["--format", fmt, "--model", str(src), "--out", str(out), "--calib-prompts", str(prompts),
                   "--no-progress", "--overwrite", *extra])
        assert rc == 0

    return shared_dir(tmp_path_factory, name, build)


def copy_checkpoint(src: Path, dst: Path, edit=None) -> Path:
    """Copy a single-file checkpoint directory, optionally editing its tensors dict in between."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.name != "model.safetensors":
            (dst / p.name).write_bytes(p.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    if edit is not None:
        edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())
