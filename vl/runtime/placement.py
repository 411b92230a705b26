"""Device placement with accelerate, applied to a loaded model from outside (model code stays plain math).

`device_map`: None (leave as loaded, CPU), "cpu", "cuda"/"cuda:N", "auto" (accelerate's
`infer_auto_device_map` + `dispatch_model`: GPU(s) first, then CPU, then disk offload for models larger than
memory), or an explicit {module_name: device} dict. `max_memory` is accelerate's {device: bytes | "10GiB"}.
Weights are moved, never copied: an offloaded block's tensors live on the CPU or on disk and are brought to
the execution device one block at a time by accelerate's hooks. Disk offload without an `offload_dir` writes to
a temporary folder that is deleted with the model (at exit at the latest).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref

import torch
from torch import nn

from vl.errors import ConfigError

log = logging.getLogger(__name__)

# Blocks never split across devices; modules that use their submodules' weights directly (not by calling
# them) must have all their weights loaded before their forward.
NO_SPLIT = ["Block", "VisionProjector"]  # timm's ViT block class is also named Block
PRELOAD = ["Mamba2Mixer", "MoE", "PatchGenerator"]


def execution_device(model: nn.Module) -> torch.device:
    """Where inputs go: the device of the embeddings (the first layer) or the one accelerate chose."""
    dev = getattr(model, "execution_device", None)
    if dev is not None:
        return torch.device(dev)
    lm = getattr(model, "language_model", model)
    return lm.backbone.embeddings.weight.device


def place(model: nn.Module, device_map, max_memory=None, offload_dir: str | None = None) -> nn.Module:
    if device_map is None:
        return model
    if isinstance(device_map, str) and device_map != "auto":
        dev = torch.device(device_map)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device_map={device_map!r} but CUDA is not available; use 'cpu' or 'auto'")
        model = model.to(dev)
        model.execution_device = dev
        return model
    from accelerate import dispatch_model, infer_auto_device_map

    if device_map == "auto":
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=NO_SPLIT,
                                           dtype=next(model.parameters()).dtype)
    if isinstance(device_map, dict) and set(device_map.values()) == {"disk"}:
        raise ConfigError(f"max_memory={max_memory} leaves room for no block of the model in memory; raise it")
    if not isinstance(device_map, dict) or not device_map:
        raise ConfigError(f"device_map must be None, 'cpu', 'cuda[:N]', 'auto' or a non-empty dict, got {device_map!r}")
    devices = set(device_map.values())
    main = next((d for d in device_map.values() if d not in ("cpu", "disk")), "cpu")
    own_dir = "disk" in devices and offload_dir is None
    if own_dir:  # a copy of the offloaded weights, ours to delete: with the model, or at exit at the latest
        offload_dir = tempfile.mkdtemp(prefix="vl-offload-")
    log.info("placing model: %s", {d: sum(1 for v in device_map.values() if v == d) for d in devices})
    try:
        model = dispatch_model(model, device_map=device_map, main_device=main, offload_dir=offload_dir,
                               preload_module_classes=PRELOAD)
    except BaseException:
        if own_dir:
            shutil.rmtree(offload_dir, ignore_errors=True)
        raise
    if own_dir:
        model.offload_dir = offload_dir
        weakref.finalize(model, shutil.rmtree, offload_dir, ignore_errors=True)
    model.execution_device = torch.device(main if isinstance(main, str) else f"cuda:{main}")
    model.device_map = device_map
    return model
