"""`vl quantize`: export a BF16 / FP32 checkpoint to FP8 or NVFP4 in NVIDIA ModelOpt's layout.

    vl quantize --format nvfp4 --model IN --out OUT [--calib-prompts FILE] [--hadamard] [--block-2d]
                [--exclude-lm-head | --no-exclude-lm-head]

The work is `vl.quantize.ptq.quantize_checkpoint`; this file only parses flags and prints the summary. The quantizer
(torch, transformers) is imported after the flags are parsed, so `--help` and a flag error answer at once; the
format is checked by the quantizer, before any weight loads.
"""

from __future__ import annotations

import argparse
import logging
import sys

from vl.errors import VLError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vl quantize", description=(
        "Post-training quantization of a BF16/FP32 checkpoint into a ModelOpt FP8 or NVFP4 checkpoint "
        "(weights, config.json quantization_config, hf_quant_config.json, tokenizer files). Activation scales are "
        "calibrated on --calib-prompts, or on built-in synthetic documents and video clips."))
    p.add_argument("--format", required=True, metavar="fp8|nvfp4", help="fp8 (E4M3 per-tensor, W8A8) or "
                   "nvfp4 (E2M1 + E4M3 16-element block scales, W4A4)")
    p.add_argument("--model", required=True, help="input checkpoint directory (NemotronH_Nano_VL_V2 or nemotron_h)")
    p.add_argument("--out", required=True, help="output directory (new or empty)")
    p.add_argument("--calib-prompts", default=None, metavar="FILE",
                   help="text file, one calibration prompt per line (default: built-in synthetic documents/clips)")
    p.add_argument("--num-calib", type=int, default=8, help="number of built-in calibration samples (default 8)")
    p.add_argument("--hadamard", action="store_true",
                   help="fold a random 16x16 Hadamard rotation into the residual stream before quantizing "
                        "(same function in high precision, plain checkpoint layout)")
    p.add_argument("--block-2d", action="store_true", help="NVFP4: one scale per 16x16 weight tile (stored in the "
                   "plain [out, in/16] layout)")
    p.add_argument("--exclude-lm-head", action=argparse.BooleanOptionalAction, default=True,
                   help="keep lm_head in high precision (default: yes, as ModelOpt)")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="extra fnmatch pattern of module names to keep in high precision (repeatable)")
    p.add_argument("--dtype", default="float32", help="dtype the model is loaded and calibrated in "
                   "(default float32; bfloat16 halves the memory for large models)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic samples and the Hadamard signs")
    p.add_argument("--overwrite", action="store_true", help="allow a non-empty --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None, calib_source=None) -> int:
    """`vl quantize`; without --calib-prompts it calibrates on `calib_source` (the dispatcher, vl/cli/__init__.py,
    supplies the synthetic documents and clips of data_recipes/calibration.py)."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    from vl.quantize.ptq import quantize_checkpoint, read_prompts

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        prompts = read_prompts(args.calib_prompts) if args.calib_prompts else None
        result = quantize_checkpoint(args.model, args.out, args.format, prompts=prompts, num_calib=args.num_calib,
                                     hadamard=args.hadamard, block_2d=args.block_2d,
                                     exclude_lm_head=args.exclude_lm_head, exclude=args.exclude, dtype=args.dtype,
                                     seed=args.seed, progress=not args.no_progress, overwrite=args.overwrite,
                                     calib_source=calib_source)
    except VLError as exc:
        print(f"error [{exc.code}]: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
