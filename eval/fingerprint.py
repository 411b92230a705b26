"""What identifies an eval record: content digests of files, media and items, the model's facts, and the run
fingerprint (eval/runner.py's docstring says what goes into it and why a change never reuses a record)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from eval.backend import GenerationSettings
from eval.data import Item, MediaRef
from eval.tasks import Task
from vl.config import lm_config_from_hf, vl_config_from_hf
from vl.config.omni import omni_config_from_hf
from vl.directory import checkpoint_kind, read_config, resolve_dir

RECORD_FORMAT = 1  # bump when the meaning of a record changes; part of the fingerprint


def file_digest(path: str | os.PathLike, full_below: int = 32 << 20, samples: int = 16, chunk: int = 1 << 16) -> str:
    """sha256 of a file: the whole content below `full_below` bytes, else its size, the safetensors header
    (when it is one) and `samples` evenly spaced chunks. Sampling keeps a 24 GB checkpoint to milliseconds;
    any retraining or re-quantization changes every tensor, so the samples catch it."""
    p = Path(path)
    h = hashlib.sha256()
    size = p.stat().st_size
    h.update(str(size).encode())
    with open(p, "rb") as f:
        if size <= full_below:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return "sha256:" + h.hexdigest()
        if p.suffix == ".safetensors":
            n = int.from_bytes(f.read(8), "little")
            if 0 < n <= min(size - 8, 100 << 20):
                h.update(f.read(n))
        for i in range(samples):
            f.seek((size - chunk) * i // (samples - 1))
            h.update(f.read(chunk))
    return "sampled-sha256:" + h.hexdigest()


def media_digest(ref: MediaRef) -> str:
    if ref.data is not None:
        return "sha256:" + hashlib.sha256(ref.data).hexdigest()
    try:
        return file_digest(ref.path)
    except OSError:
        return f"missing:{ref.path}"  # fails at run time as a per-item error; a later fix changes the hash


def item_digest(task: Task, item: Item) -> str:
    """What the model is asked plus what the item is scored against: a change of either is a new item."""
    payload = {"prompt": task.prompt_text(item), "answers": list(item.answers), "fields": item.fields,
               "media": [[ref.kind, media_digest(ref)] for ref in item.media]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def model_facts(model: str, dtype: str | None = None) -> dict:
    """What identifies the model without loading it: path, digests, precision, media defaults."""
    from vl.checkpoint.load import resolve_dtype

    directory = resolve_dir(model)
    raw = read_config(directory)
    where = str(directory / "config.json")
    kind = checkpoint_kind(raw, directory)
    if kind == "nemotron_h":  # text only: no media defaults to record
        cfg = lm_config_from_hf(raw, where=where)
    elif kind == "nemotron_h_omni":  # images at native resolution: no max_num_tiles
        cfg = omni_config_from_hf(raw, where=where)
    else:
        cfg = vl_config_from_hf(raw, where=where)
    weights, files = hashlib.sha256(), hashlib.sha256()
    for p in sorted(directory.iterdir()):
        if not p.is_file() or p.name.startswith("."):
            continue
        target = weights if p.suffix == ".safetensors" else files
        target.update(f"{p.name}\0{file_digest(p)}\0".encode())
    compute = str(resolve_dtype(dtype, raw)).replace("torch.", "")
    quant = None
    hf_quant = directory / "hf_quant_config.json"
    if hf_quant.exists():
        quant = (json.loads(hf_quant.read_text()).get("quantization") or {}).get("quant_algo")
    q = raw.get("quantization_config") or (raw.get("llm_config") or {}).get("quantization_config") or {}
    quant = quant or q.get("quant_algo") or q.get("quant_method")
    return {"path": str(directory.resolve()), "weights_digest": weights.hexdigest(),
            "config_digest": file_digest(directory / "config.json"), "files_digest": files.hexdigest(),
            "dtype": compute, "precision": f"{quant} (compute {compute})" if quant else compute,
            "max_num_tiles": getattr(cfg, "max_num_tiles", None),
            "video_pruning_rate": getattr(cfg, "video_pruning_rate", None)}


def fingerprint(task: Task, facts: dict, settings: GenerationSettings, device_type: str) -> str:
    model = {k: facts.get(k) for k in ("path", "weights_digest", "config_digest", "files_digest", "precision")}
    if facts.get("remote"):  # a served model (eval/remote_backend.py): its URL and model id
        model["remote"] = facts["remote"]
    # an option left at None (its receiver's own default) is not named: a key that is absent reads as None, so
    # nothing is lost, and an option added to vl/options.py with a None default leaves earlier fingerprints (and
    # the records they key, on --resume) as they were
    decided = {k: v for k, v in dataclasses.asdict(settings).items() if k != "timeout_s" and v is not None}
    payload = {"format": RECORD_FORMAT, "model": model, "device_type": device_type,
               "task": {"name": task.name, "pre_prompt": task.pre_prompt, "post_prompt": task.post_prompt},
               "generation": {**decided, "temperature": 0.0}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
