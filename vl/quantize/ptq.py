"""Post-training quantization of a BF16 / FP32 checkpoint directory into a ModelOpt FP8 / NVFP4 one
(`vl quantize`; the library call is `quantize_checkpoint`).

The recipe is ModelOpt's PTQ (`mtq.quantize` with FP8_DEFAULT_CFG / NVFP4_DEFAULT_CFG, then
`export_hf_checkpoint`), reduced to what the released checkpoints hold (docs/format.md §11.3, §11.4): weights are
quantized from the loaded high-precision values; each quantized Linear's static `input_scale` comes from the
largest |input| seen while the model runs on calibration prompts (the user's text lines, or built-in synthetic
documents and clips sent through the real Processor, so that image tiles and video frames reach the LLM the
way they will at inference). The vision tower, `mlp1`, conv1d, norms and embeddings are never quantized;
`lm_head` is excluded unless asked (ModelOpt's default). Routed MoE experts are quantized one Linear each (the fp32
router is not), and an expert that no calibration token reached takes its layer's largest input scale. A Nemotron 3
Nano Omni directory is calibrated through its own processor, and only its LLM's Linears are packed (the audio branch
stays as it was, like the vision tower). Tensors the loader ignores (RADIO's summary indices and adaptors, MTP heads)
are copied through unchanged. Optional: the residual-stream Hadamard fold (vl/quant/rotate.py) and NVFP4 16x16 2-D
weight blocks. The output directory is a complete checkpoint: weights, `config.json` with `quantization_config`,
`hf_quant_config.json`, and every tokenizer / generation / processor file of the input.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

import torch
from torch import nn
from transformers import AutoTokenizer

from vl.checkpoint.files import CheckpointFiles, save_tensors
from vl.checkpoint.nano_vl import export_state_dict
from vl.checkpoint.nemotron_h import export_lm
from vl.checkpoint.omni import export_state_dict as export_omni
from vl.directory import read_config, resolve_dir
from vl.errors import CheckpointError, ConfigError
from vl.modeling.omni import NemotronOmni
from vl.processing.load import load_processor
from vl.quant.config import is_excluded, never_quantized
from vl.quant.experts import split_fused_experts, split_to_hub_name
from vl.quant.rotate import rotate_residual_stream
from vl.runtime.pretrained import load_pretrained
from vl.quant.export import (
    PRODUCER,
    collect_input_amax,
    exclude_patterns,
    make_hf_quant_config,
    quantize_state_dict,
    write_hf_quant_config,
)

log = logging.getLogger(__name__)

FORMATS = {"fp8": "FP8", "nvfp4": "NVFP4"}
# the MoE's fp32 router stays in high precision (ModelOpt's default); the routed experts are quantized one Linear each
MOE_UNQUANTIZED = ("*mixer.gate",)
# Nemotron 3 Nano Omni's audio branch and vision final norm, named for the readers of hf_quant_config.json (the
# vision tower and mlp1 are already never quantized); only the LLM's Linears are packed, as in the released FP8 / NVFP4
OMNI_UNQUANTIZED = ("sound_encoder*", "sound_projection*", "vision_projector*")
OMNI_CALIB_SIZE = 512  # px: the side of the synthetic calibration pages and clips for Omni
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "config.json", "hf_quant_config.json")
NOT_COPIED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


@dataclass
class Calibration:
    """One calibration input: keyword arguments of the model's forward, plus what it is for the report."""

    kwargs: dict
    what: str


@dataclass
class QuantizeResult:
    out_dir: Path
    algo: str
    quantized: list[str]  # the model's module names now packed (routed experts one Linear each)
    excluded: list[str]  # Linear module names left in high precision (patterns or never-quantized)
    calibration: list[str]  # one description per calibration input
    input_amax: dict[str, float]
    options: dict
    in_bytes: int
    out_bytes: int
    seconds: float
    tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # what was written

    def summary(self) -> str:
        mb = 1 / 2**20
        return (f"wrote {self.out_dir}: {self.algo}, {len(self.quantized)} Linears quantized, "
                f"{len(self.excluded)} left in high precision; calibrated on {len(self.calibration)} inputs; "
                f"weights {self.in_bytes * mb:.1f} MiB -> {self.out_bytes * mb:.1f} MiB; {self.seconds:.1f} s")


# --- calibration inputs --------------------------------------------------------------------------------
def read_prompts(path) -> list[str]:
    """One prompt per non-empty line of a UTF-8 text file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--calib-prompts {path}: expected a readable UTF-8 text file, found: {e}") from None
    prompts = [ln.strip() for ln in lines if ln.strip()]
    if not prompts:
        raise ConfigError(f"--calib-prompts {path}: expected at least one non-empty line, found none")
    return prompts


class CalibrationSource(Protocol):
    """Where calibration samples come from when no prompts are given (the `vl quantize` command supplies the
    synthetic documents and clips of data_recipes/calibration.py); the quantizer itself knows no data set."""

    def messages(self, n: int, tile_size: int, seed: int) -> list[tuple[list[dict], str]]: ...

    def texts(self, n: int, seed: int) -> list[str]: ...


def calibration_inputs(model_dir: Path, model: nn.Module, prompts: list[str] | None, n: int,
                       seed: int = 0, source: CalibrationSource | None = None) -> list[Calibration]:
    """Model inputs for calibration: the user's prompts (text) or `n` samples of `source`."""
    if n < 1 and prompts is None:
        raise ConfigError(f"num_calib={n}: expected at least one calibration input")
    if prompts is None and source is None:
        raise ConfigError("no calibration data: pass prompts (vl quantize --calib-prompts FILE) or a calibration "
                          "source (vl quantize uses synthetic documents and clips by default)")
    omni = isinstance(model, NemotronOmni)
    if hasattr(model, "prepare_inputs") or omni:  # a VL model: the processor is the one path from messages to inputs
        try:
            proc = load_processor(model_dir)
        except OSError as e:
            raise CheckpointError(f"{model_dir}: the tokenizer could not be loaded ({e}); calibration needs "
                                  "it") from None
        if prompts is not None:
            items = [([{"role": "user", "content": p}], f"prompt {i + 1}") for i, p in enumerate(prompts)]
        else:  # Omni sees images at native resolution: the synthetic pages are drawn at Nano V2 VL's tile size
            items = source.messages(n, OMNI_CALIB_SIZE if omni else proc.config.force_image_size, seed)
        out = []
        for msgs, what in items:
            x = proc(msgs, add_generation_prompt=False)
            kwargs = (x.model_inputs() if omni
                      else dict(input_ids=x.input_ids, pixel_values=x.pixel_values, media=x.media))
            out.append(Calibration(kwargs, what))
        return out
    texts = prompts
    if texts is None:  # text-only: the source's samples as plain text
        texts = source.texts(n, seed)
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    except (OSError, ValueError) as e:
        if prompts is not None:
            raise CheckpointError(f"{model_dir}: --calib-prompts needs the checkpoint's tokenizer, which could not "
                                  f"be loaded ({e})") from None
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(seed)
        log.warning("vl quantize: %s has no tokenizer; calibrating on %d sequences of random token ids", model_dir, n)
        return [Calibration(dict(input_ids=torch.randint(0, vocab, (1, 64), generator=g)), f"random ids {i + 1}")
                for i in range(n)]
    return [Calibration(dict(input_ids=torch.tensor([tok(t, add_special_tokens=False)["input_ids"]])), f"text {i + 1}")
            for i, t in enumerate(texts)]


# --- the pass -----------------------------------------------------------------------------------------------
def _bar(items, desc: str, progress: bool, total: int | None = None):
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False)


def _fill_expert_amax(amax: dict[str, float], names: list[str]) -> list[str]:
    """Routed experts no calibration token was sent to get the largest input amax of their layer's other experts of
    the same projection (their inputs come from the same residual stream, or the same kind of hidden state);
    returns their names."""
    largest: dict[str, float] = {}  # `….mixer.experts.up_proj` -> the largest amax its experts saw
    for n, v in amax.items():
        if ".mixer.experts." in n:
            group = n.rsplit(".", 1)[0]
            largest[group] = max(largest.get(group, v), v)
    filled = [n for n in names if n not in amax and n.rsplit(".", 1)[0] in largest and ".mixer.experts." in n]
    for name in filled:
        amax[name] = largest[name.rsplit(".", 1)[0]]
    return filled


def _checkpoint_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under the checkpoint names of its own format (hub layout)."""
    if isinstance(model, NemotronOmni):
        return export_omni(model)
    if hasattr(model, "prepare_inputs"):
        return export_state_dict(model)
    return export_lm(model.state_dict())


def _copy_side_files(src: Path, dst: Path) -> list[str]:
    copied = []
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.name in WEIGHT_FILES or p.name.endswith(NOT_COPIED_SUFFIXES):
            continue
        shutil.copy2(p, dst / p.name)
        copied.append(p.name)
    return copied


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def quantize_checkpoint(model_dir, out_dir, fmt: str = "nvfp4", *, prompts: Iterable[str] | None = None,
                        num_calib: int = 8, hadamard: bool = False, block_2d: bool = False,
                        exclude_lm_head: bool = True, exclude: Iterable[str] = (), dtype="float32", seed: int = 0,
                        progress: bool = True, overwrite: bool = False,
                        calib_source: CalibrationSource | None = None) -> QuantizeResult:
    """BF16 / FP32 checkpoint at `model_dir` -> ModelOpt `fmt` ("fp8" | "nvfp4") checkpoint at `out_dir`, its
    activation scales calibrated on `prompts` or on `num_calib` samples of `calib_source`."""

    t0 = time.perf_counter()
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: expected one of {sorted(FORMATS)}")
    algo = FORMATS[fmt]
    if block_2d and algo != "NVFP4":
        raise ConfigError("--block-2d applies to NVFP4 weight blocks only; drop it for --format fp8")
    src = resolve_dir(model_dir)
    out = Path(out_dir).expanduser()
    if out.resolve() == src.resolve():
        raise ConfigError(f"--out {out} is the input directory; expected a new directory for the quantized copy")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out} exists and is not empty; expected a new or empty directory (or --overwrite)")
    raw = read_config(src)
    model = load_pretrained(src, dtype=dtype)
    if model.quantization is not None:
        raise ConfigError(f"{src} is already a {model.quantization.fmt} checkpoint; quantize the BF16/FP32 original")
    lm = getattr(model, "language_model", model)
    prefix = "language_model." if lm is not model else ""
    if hadamard:
        rotate_residual_stream(model, seed=seed)
    moe = "E" in lm.config.pattern
    if moe:  # routed experts become one Linear each, calibrated and packed like any other (as the released FP8 / NVFP4)
        split_fused_experts(lm)
    extra = (tuple(exclude) + (MOE_UNQUANTIZED if moe else ())
             + (OMNI_UNQUANTIZED if isinstance(model, NemotronOmni) else ()))
    pats = exclude_patterns(exclude_lm_head, extra)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith(prefix)]
    names = [n for n in linears if not never_quantized(n) and not is_excluded(n, pats)]
    excluded = [n for n in linears if n not in names]

    calib = calibration_inputs(src, model, list(prompts) if prompts is not None else None, num_calib, seed,
                               calib_source)

    def run():  # every Linear must see every position: the stateless tail too, not only the kept logits
        tail, lm.stateless_tail = lm.stateless_tail, len(lm.backbone.layers)
        try:
            for c in _bar(calib, "calibrating", progress):
                model(**c.kwargs, logits_to_keep=1)
        finally:
            lm.stateless_tail = tail

    amax = collect_input_amax(model, run, names)
    uncalibrated = _fill_expert_amax(amax, names)
    if uncalibrated:
        log.warning("vl quantize: %d routed experts saw no calibration token; their input scale is the largest of "
                    "their layer's other experts (more or longer calibration inputs reach more experts)",
                    len(uncalibrated))
    ck = {n: split_to_hub_name(f"{n}.weight")[: -len(".weight")] for n in names}  # checkpoint module names

    sd = _checkpoint_state_dict(model)
    files = CheckpointFiles(src)
    declared = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(
        raw.get("torch_dtype") or raw.get("dtype") or "", None)
    in_bytes = sum(math.prod(i.shape) * i.dtype.itemsize for i in files.infos.values())
    weights = {f"{ck[n]}.weight" for n in names}
    tensors: dict[str, torch.Tensor] = {}
    for key, t in sd.items():  # high-precision tensors go back in the dtype they came in
        if key in weights or not t.is_floating_point():
            continue
        stored = files.infos[key].dtype if key in files.infos else declared or t.dtype
        tensors[key] = t.detach().to(stored if stored.is_floating_point else t.dtype)
    for key, t in sd.items():
        if not t.is_floating_point():
            tensors[key] = t
    kept = [k for k in files.names() if k not in sd]  # what the loader ignores (RADIO's summary indices and
    for key in kept:  # adaptors, MTP heads, ...) goes through unchanged: the copy holds all the original held
        tensors[key] = files.get(key)
    one_d = [n for n in names if block_2d and sd[f"{ck[n]}.weight"].shape[0] % 16]  # 16x16 tiles need rows % 16 == 0
    if one_d:
        log.warning("vl quantize: --block-2d: %d Linears have a row count that is not a multiple of 16 and keep "
                    "1-D blocks: %s", len(one_d), ", ".join(one_d))
    for name in _bar(names, "quantizing", progress):
        q = quantize_state_dict({f"{ck[name]}.weight": sd[f"{ck[name]}.weight"]}, [ck[name]], algo,
                                {ck[name]: amax[name]}, exclude=pats, block_2d=block_2d and name not in one_d)
        tensors.update(q)
    options = dict(format=fmt, algo=algo, hadamard=hadamard, block_2d=block_2d, exclude_lm_head=exclude_lm_head,
                   num_calib=len(calib), seed=seed, calib_dtype=str(dtype), block_2d_skipped=one_d,
                   experts_uncalibrated=len(uncalibrated))
    skipped = [n for n in excluded if not is_excluded(n, pats)]
    hf_cfg = make_hf_quant_config(algo, pats + tuple(skipped))
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, out, metadata={"vl_quantize": json.dumps(options)})
    cfg = dict(raw)
    q = hf_cfg["quantization"]
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": algo,
                                  "kv_cache_quant_algo": q["kv_cache_quant_algo"],
                                  "exclude_modules": q["exclude_modules"], "producer": dict(PRODUCER),
                                  **({"group_size": q["group_size"]} if "group_size" in q else {})}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_hf_quant_config(out, hf_cfg)
    _copy_side_files(src, out)
    return QuantizeResult(out, algo, names, excluded, [c.what for c in calib], amax, options, in_bytes,
                          _nbytes(tensors.values()), time.perf_counter() - t0, tensors)
