"""FP8 / NVFP4 figures for `vl bench`: resident weight bytes and decode tokens/s per format and execution mode,
and logit error / greedy-token agreement against the BF16 original, with and without the Hadamard fold.

Everything is measured in one process on one model, as ratios against the BF16 run of the same model
(docs/design.md §3). Without `model_dir`, a random ~32M-parameter Nano-V2-VL (the 12B model's layer mix at width
512, a ViT-Tiny RADIO tower, 128 px tiles, the demo model's tokenizer) is built and saved as BF16 in a temporary
directory, then exported with `vl quantize`'s own code (vl/quantize/ptq.py). Random weights have no outlier
channels, so they understate what the Hadamard rotation does on trained weights; `outlier_gain` plants a few
(an RMSNorm gain of that size on 1% of the channels, as trained LLMs show) to see that case.

    python -m vl.bench.quant [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import vl
from vl.checkpoint.nano_vl import save_pretrained
from vl.config import LMConfig, MediaTokenConfig, VisionConfig, VLConfig
from vl.directory import default_model
from vl.errors import ConfigError, VLError
from vl.modeling.random_init import randomize_
from vl.quant.export import collect_input_amax, exclude_patterns, quantizable_linear_names, quantize_state_dict
from vl.quant.linear import MODES  # the one list of quantized execution modes
from vl.quant.linear import QuantizedLinear, resident_weight_bytes, swap_quantized_linears
from vl.runtime.cpu import hugepages
from vl.runtime.generate import generate_steps

TEXT = ("The total is 47. Which field is at the top? NAME. The red circle moves to the right, then the blue "
        "square flashes twice. How many stars are there? 3. Describe the image in one sentence.")


def bench_vl_config(vocab_size: int = 8192, eos_token_id=(2,), img_context_id: int = 10, video_context_id: int = 11):
    """~32M parameters: LLM width 512 with the 12B model's M/-/* mix, vocab 8192, ViT-Tiny tower, 128 px tiles."""
    lm = LMConfig(vocab_size=vocab_size, hidden_size=512, pattern="M-M-M*-M-", num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, intermediate_size=2048, mamba_num_heads=16, mamba_head_dim=64,
                  n_groups=2, ssm_state_size=64, chunk_size=64, eos_token_id=tuple(eos_token_id))
    return VLConfig(lm=lm, vision=VisionConfig(model="vit_tiny_patch16_224", num_prefix_tokens=4),
                    force_image_size=128, projector_hidden_size=1024, vit_hidden_size=192,
                    tokens=MediaTokenConfig(img_context_id=img_context_id, video_context_id=video_context_id))


@torch.no_grad()
def _randomize(model: nn.Module, seed: int, outlier_gain: float = 0.0) -> None:
    """O(1) activations (vl.modeling.random_init), optionally with outlier channels on the residual path."""
    g = torch.Generator().manual_seed(seed)
    randomize_(model, generator=g)
    if outlier_gain:
        lm = model.language_model
        d = lm.config.hidden_size
        idx = torch.randperm(d, generator=g)[: max(1, d // 100)]
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight") and "mixer" not in name:  # residual-path RMSNorm gains
                p[idx] *= outlier_gain


def build_bench_model(directory, seed: int = 0, outlier_gain: float = 0.0) -> Path:
    """Random Nano-V2-VL (bench_vl_config) with the shipped demo model's tokenizer, saved as BF16 at `directory`."""
    from transformers import AutoTokenizer

    from vl.modeling.vlm import NemotronVL

    directory = Path(directory)
    tok = AutoTokenizer.from_pretrained(default_model())  # byte-level BPE with the Nemotron control tokens
    cfg = bench_vl_config(eos_token_id=(tok.convert_tokens_to_ids("<SPECIAL_12>"),),
                          img_context_id=tok.convert_tokens_to_ids("<image>"),
                          video_context_id=tok.convert_tokens_to_ids("<video>"))
    torch.manual_seed(seed)
    model = NemotronVL(cfg).eval()
    _randomize(model, seed, outlier_gain)
    save_pretrained(model.to(torch.bfloat16), directory, tokenizer=tok)
    return directory


def _eval_inputs(model_dir: Path, n: int, seed: int, source) -> list[dict]:
    """Teacher-forcing inputs: `source`'s documents with their question and answer, through the Processor."""
    proc = vl.load_processor(model_dir)
    out = []
    for msgs, _ in source.messages(2 * n, proc.config.force_image_size, seed + 1000)[::2]:  # documents
        msgs[-1]["content"] = msgs[-1]["content"] + " " + TEXT
        x = proc(msgs, add_generation_prompt=False)
        out.append(dict(input_ids=x.input_ids, pixel_values=x.pixel_values, media=x.media))
    return out


@torch.no_grad()
def _logits(model, inputs: list[dict]) -> list[torch.Tensor]:
    return [model(**x).logits[0].float() for x in inputs]


@torch.no_grad()
def _decode_speed(model, prompt_tokens: int, new_tokens: int, seed: int) -> tuple[float, list[int]]:
    """(decode tokens/s after prefill, greedy ids) for a random-id prompt on the LLM alone."""
    lm = getattr(model, "language_model", model)
    ids = torch.randint(20, lm.config.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(seed))
    marks, toks = {}, []
    for ev in generate_steps(lm, input_ids=ids, max_new_tokens=new_tokens,
                             on_prefill_done=lambda: marks.setdefault("t", time.perf_counter())):
        toks.append(ev.tokens[0])
    dt = time.perf_counter() - marks["t"]
    return (new_tokens - 1) / dt if dt > 0 else float("nan"), toks  # the first token comes from the prefill


def _quantized_bytes(model) -> int:
    return sum(resident_weight_bytes(m) for m in model.modules() if isinstance(m, QuantizedLinear))


def _bf16_bytes(model, names) -> int:
    """What the Linears `names` hold as BF16 weights (2 bytes per element)."""
    return sum(2 * model.get_submodule(n).weight.numel() for n in names)


def _errors(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict:
    num = sum(float((a - b).pow(2).sum()) for a, b in zip(ref, got))
    den = sum(float(a.pow(2).sum()) for a in ref)
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(ref, got))
    total = sum(a.shape[0] for a in ref)
    return dict(logit_rel_err=math.sqrt(num / den), logit_max_abs_err=max(float((a - b).abs().max())
                                                                           for a, b in zip(ref, got)),
                top1_agreement=agree / total, positions=total)


def quant_table(model_dir=None, *, formats=("fp8", "nvfp4"), modes=MODES, hadamard=(False, True), block_2d=True,
                dtype: str = "float32", prompt_tokens: int = 32, new_tokens: int = 16, rounds: int = 3,
                num_calib: int = 2, num_eval: int = 2, seed: int = 0, outlier_gain: float = 0.0,
                threads: int | None = 1, progress: bool = False, work_dir=None, calib_source=None) -> list[dict]:
    """Rows (dicts) of the quantization figures.

    kind="speed":    format, mode, status, resolved_mode, resident_weight_bytes (whole model), lm_bytes,
                     quantized_linear_bytes (the packed Linears as held), packable_bytes_bf16 (those Linears as
                     BF16), decode_tokens_per_s (median over `rounds` interleaved rounds), speed_vs_bf16.
    kind="accuracy": format, hadamard, block_2d (NVFP4 16x16 weight tiles; one extra row), logit_rel_err
                     (||l_q - l_bf16|| / ||l_bf16|| over every position of `num_eval` synthetic documents
                     with their question and answer), logit_max_abs_err,
                     top1_agreement (teacher-forced argmax agreement on those positions), greedy_prefix (how many
                     of `new_tokens` greedy tokens equal BF16's before the first difference), all with BF16
                     activations (weight-only); act_logit_rel_err / act_top1_agreement: the same with the inputs
                     quantized by the static input_scale (W8A8 / W4A4, what the native kernels compute).
    The BF16 row is the checkpoint itself loaded in `dtype`, the compute dtype (float32 by default: CPUs
    without BF16 units run BF16 matmuls many times slower). Quantized models run weight-only for accuracy.
    `threads`: torch intra-op threads while measuring (1 by default: on a shared or small machine, thread
    oversubscription makes small decode steps several times slower and the figures noisy); None keeps torch's.
    `calib_source`: where calibration and evaluation documents come from (a `vl.quantize.ptq.CalibrationSource`;
    the `vl bench` command supplies the synthetic one of data_recipes/calibration.py).
    """
    if calib_source is None:
        raise ConfigError("quant_table needs calib_source (e.g. data_recipes.calibration.SYNTHETIC): the documents "
                          "it calibrates and evaluates on")
    from vl.quantize.ptq import quantize_checkpoint

    logging.getLogger("vl").setLevel(logging.ERROR)  # the per-load notices would flood the table
    tmp = tempfile.TemporaryDirectory(prefix="vl-quant-bench-") if work_dir is None else None
    root = Path(tmp.name if tmp else work_dir)
    prev_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        if model_dir is None:
            model_dir = build_bench_model(root / "bf16", seed=seed, outlier_gain=outlier_gain)
        model_dir = Path(model_dir)
        inputs = _eval_inputs(model_dir, num_eval, seed, calib_source)
        ref = vl.load_pretrained(model_dir, dtype=dtype)
        ref_logits = _logits(ref, inputs)
        _, ref_tokens = _decode_speed(ref, prompt_tokens, new_tokens, seed)
        rows, exports = [], {}
        variants = [(fmt, rot, False) for fmt in formats for rot in hadamard]
        variants += [("nvfp4", False, True)] if block_2d and "nvfp4" in formats else []
        for fmt, rot, b2d in variants:
            out = root / f"{fmt}{'-hadamard' if rot else ''}{'-2d' if b2d else ''}"
            res = quantize_checkpoint(model_dir, out, fmt, num_calib=num_calib, hadamard=rot, block_2d=b2d,
                                      seed=seed, progress=progress, overwrite=True, dtype="float32",
                                      calib_source=calib_source)
            if not b2d:
                exports[(fmt, rot)] = res
            m = vl.load_pretrained(out, dtype=dtype, quant_mode="weight-only")
            _, toks = _decode_speed(m, prompt_tokens, new_tokens, seed)
            prefix = next((i for i, (a, b) in enumerate(zip(toks, ref_tokens)) if a != b), len(ref_tokens))
            row = dict(kind="accuracy", format=fmt, hadamard=rot, block_2d=b2d,
                       **_errors(ref_logits, _logits(m, inputs)),
                       greedy_prefix=prefix, new_tokens=new_tokens, quantized_linears=len(res.quantized))
            for q in m.modules():  # the checkpoint's own W8A8 / W4A4 numerics (static input_scale)
                if isinstance(q, QuantizedLinear):
                    q.emulate_activations = True
            act = _errors(ref_logits, _logits(m, inputs))
            rows.append(dict(row, act_logit_rel_err=act["logit_rel_err"], act_top1_agreement=act["top1_agreement"]))
            del m
        # speed and memory: every (format, mode) loaded side by side, decoded in interleaved rounds
        runs = {("bf16", "-"): ref}
        speed_rows = {("bf16", "-"): dict(kind="speed", format="bf16", mode="-", status="ok", resolved_mode="-",
                                          quantized_linear_bytes=0, params=sum(p.numel() for p in ref.parameters()))}
        for fmt in formats:
            if (fmt, False) not in exports:
                continue
            packable = _bf16_bytes(ref, exports[(fmt, False)].quantized)
            speed_rows[("bf16", "-")]["packable_bytes_bf16"] = packable
            for mode in modes:
                row = dict(kind="speed", format=fmt, mode=mode, packable_bytes_bf16=packable)
                try:
                    m = vl.load_pretrained(exports[(fmt, False)].out_dir, dtype=dtype, quant_mode=mode)
                except VLError as e:
                    speed_rows[(fmt, mode)] = dict(row, status=f"unavailable: {e}")
                    continue
                runs[(fmt, mode)] = m
                speed_rows[(fmt, mode)] = dict(row, status="ok", resolved_mode=m.quantization.mode,
                                               quantized_linear_bytes=_quantized_bytes(m))
        tps: dict = {k: [] for k in runs}
        for r in range(rounds):
            for key, m in runs.items():
                tps[key].append(_decode_speed(m, prompt_tokens, new_tokens, seed + r)[0])
        base = statistics.median(tps[("bf16", "-")])
        for key, m in runs.items():
            med = statistics.median(tps[key])
            speed_rows[key].update(resident_weight_bytes=resident_weight_bytes(m),
                                   lm_bytes=resident_weight_bytes(getattr(m, "language_model", m)),
                                   decode_tokens_per_s=med, speed_vs_bf16=med / base, dtype=dtype, rounds=rounds,
                                   threads=torch.get_num_threads())
        return list(speed_rows.values()) + rows
    finally:
        torch.set_num_threads(prev_threads)
        if tmp is not None:
            tmp.cleanup()


def format_table(rows: list[dict]) -> str:
    mib = 1 / 2**20
    lines = ["format  mode         status  resident MiB  LLM MiB  packed MiB  packed/BF16  decode tok/s  vs bf16"]
    for r in rows:
        if r["kind"] != "speed":
            continue
        if r["status"] != "ok":
            lines.append(f"{r['format']:<7} {r['mode']:<12} {r['status'][:100]}")
            continue
        ratio = r["quantized_linear_bytes"] / r["packable_bytes_bf16"] if r.get("packable_bytes_bf16") else 0.0
        lines.append(f"{r['format']:<7} {r['mode']:<12} ok      {r['resident_weight_bytes'] * mib:12.1f} "
                     f"{r['lm_bytes'] * mib:8.1f} {r['quantized_linear_bytes'] * mib:11.1f} {ratio:12.3f}"
                     f" {r['decode_tokens_per_s']:13.1f} {r['speed_vs_bf16']:8.2f}")
    lines.append("")
    lines.append("format  variant   logit rel err  max abs err  top-1 agree  greedy prefix  "
                 "| W8A8/W4A4: rel err  top-1")
    for r in rows:
        if r["kind"] == "accuracy":
            variant = "hadamard" if r["hadamard"] else "2-D" if r["block_2d"] else "plain"
            lines.append(f"{r['format']:<7} {variant:<9} {r['logit_rel_err']:13.4f} "
                         f"{r['logit_max_abs_err']:12.3f} {r['top1_agreement']:12.3f} "
                         f"{r['greedy_prefix']:8d}/{r['new_tokens']:<5d}"
                         f"  | {r['act_logit_rel_err']:18.4f} {r['act_top1_agreement']:6.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vl.bench.quant", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="BF16/FP32 checkpoint directory (default: a random ~32M model)")
    p.add_argument("--dtype", default="float32", help="compute dtype (default float32)")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="interleaved decode rounds per model (median)")
    p.add_argument("--threads", type=int, default=1, help="torch threads while measuring (0: torch's default)")
    p.add_argument("--outlier-gain", type=float, default=0.0, help="plant outlier channels in the random model")
    p.add_argument("--no-hadamard", action="store_true", help="skip the Hadamard exports")
    p.add_argument("--no-block-2d", action="store_true", help="skip the NVFP4 2-D block export")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    rows = quant_table(args.model, dtype=args.dtype, new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens,
                       rounds=args.rounds, threads=args.threads or None,
                       outlier_gain=args.outlier_gain, hadamard=(False,) if args.no_hadamard else (False, True),
                       block_2d=not args.no_block_2d)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        print(format_table(rows))
        print(f"\n({rows[0]['params'] / 1e6:.1f}M parameters, compute dtype {args.dtype}, "
              f"{rows[0]['threads']} thread(s), {rows[0]['rounds']} rounds, "
              f"{time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())


@torch.no_grad()
def quantized_copy(model: nn.Module, fmt: str, calib_ids: torch.Tensor, mode: str = "auto") -> nn.Module:
    """A Nemotron-H LM with `model`'s weights as `vl quantize --format fmt` writes them (ModelOpt per-tensor FP8
    or NVFP4 with static input scales from a calibration pass on `calib_ids`, lm_head left in high precision)
    and swapped in as a user's load does (`mode` auto: weight-only on the CPU). Compute dtype = model's dtype."""
    from vl.quantize.ptq import FORMATS

    dtype = next(model.parameters()).dtype
    names = quantizable_linear_names(model, exclude_patterns())
    amax = collect_input_amax(model, lambda: model(calib_ids))
    sd = {k: v.float() for k, v in model.state_dict().items()}
    q = quantize_state_dict(sd, names, FORMATS[fmt], amax)
    out = copy.deepcopy(model)
    rep = swap_quantized_linears(out, q, mode, compute_dtype=dtype)
    out.load_state_dict({k: v.to(dtype) for k, v in q.items() if k not in rep.consumed_keys}, strict=False)
    hugepages.advise(out)  # as vl.load_pretrained does (the other passes came with the copied model)
    return out
