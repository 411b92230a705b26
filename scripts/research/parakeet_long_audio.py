"""Omni's Parakeet encoder on one long clip: the released widths (hidden 1024, 24 layers, 8 heads), random BF16
weights with the CPU matmul passes, as `vl bench --media` builds its towers (vl/bench/media.py `_random_part`), fed
random mel features of each length asked with the mask the Omni's processor gives (1 + L // 160 frames, the last one
left out, so the clip's last position is padding); seconds per clip. `--rev REV` times the attention of the module at that git
revision instead (its `RelPositionAttention.forward` and `_attend`), for a before / after in one sitting;
`--profile` prints torch's operator profile of each clip.

    PYTHONPATH=. .venv/bin/python scripts/research/parakeet_long_audio.py [--threads 2] [--seconds 120,300,600] \
        [--rev HEAD~1] [--profile]
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import torch

import vl.modeling.parakeet as parakeet
from vl.bench.media import _random_part
from vl.config.omni import omni_30b_a3b

REPO = Path(__file__).resolve().parents[2]


def attention_at(rev: str) -> None:
    """Swap in the attention of vl/modeling/parakeet.py as it was at `rev`."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:vl/modeling/parakeet.py"], capture_output=True,
                         text=True, check=True).stdout
    ns: dict = {}
    exec(compile(src, f"parakeet@{rev}", "exec"), ns)
    parakeet.RelPositionAttention.forward = ns["RelPositionAttention"].forward
    parakeet.RelPositionAttention._attend = ns["RelPositionAttention"]._attend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", default="120,300,600", help="clip lengths in seconds, comma-separated")
    p.add_argument("--rev", default=None, help="time the attention of this git revision instead")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.rev:
        attention_at(args.rev)
    cfg = omni_30b_a3b().audio
    with torch.device("meta"):
        encoder = parakeet.ParakeetEncoder(cfg)
    _random_part(encoder, torch.bfloat16, 3)
    for seconds in (int(s) for s in args.seconds.split(",")):
        features = torch.randn(1, seconds * 100 + 1, cfg.num_mel_bins, dtype=torch.bfloat16)  # 10 ms hop
        mask = torch.ones(features.shape[:2], dtype=torch.bool)
        mask[:, -1] = False
        with torch.inference_mode():
            t0 = time.perf_counter()
            if args.profile:
                with torch.profiler.profile(record_shapes=True) as prof:
                    hidden, _ = encoder(features, mask)
            else:
                hidden, _ = encoder(features, mask)
            took = time.perf_counter() - t0
        print(f"{args.rev or 'working tree'}: {seconds} s of audio -> {hidden.shape[1]} tokens: {took:.1f} s "
              f"({args.threads} threads)", flush=True)
        if args.profile:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
