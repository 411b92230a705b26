"""Does a vision token say where it is? A linear probe of each token's cell in its frame's grid.

EVS keeps a few tokens of a frame and drops the rest; the LLM (no position encoding in Nemotron-H) then knows
a kept token's place only if the token's content carries it. For the held-out `video_direction` clips this
encodes every frame with the model's tower and projector, runs EVS at --q, and fits a linear classifier (cell
index from one projector token) on the kept tokens of frames 1.. of the first 3/4 of the clips; it reports the
accuracy on the rest, next to the majority class. It also reports how often EVS kept the cell under the
moving shape's centre, the evidence the question needs. A tower trained with `Stage.position_weight` should read
high; the from-scratch demo model's probe heads saw a tile's tokens flattened, so its tokens need not carry their place.

Usage: .venv/bin/python scripts/research/probe_token_position.py [--model vl/demo] [--clips 120] [--q 0.75]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


def main() -> None:
    from data_recipes.synthetic import make_dataset
    from data_recipes.vision_targets import position_bin
    from token_reduction.evs import evs
    from token_reduction.protocol import TokenLayout
    from vl.runtime.pretrained import load_pretrained
    from vl.cli import default_model
    from vl.processing.images import normalize

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model)")
    p.add_argument("--clips", type=int, default=120)
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--q", type=float, default=0.75)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = load_pretrained(a.model or default_model()).eval()
    cfg = model.config
    grid = int(round(cfg.tokens_per_tile ** 0.5))  # tokens a side of a tile, after the pixel shuffle
    clips = make_dataset("video", "test", a.clips, 0, families=["video_direction"], tile_size=cfg.force_image_size,
                         num_frames=a.frames, fps=2.0)
    feats, cells, clip_ids = [], [], []
    mover_kept = later_frames = 0  # frames 1.. whose moving shape's centre cell EVS kept; frames 1..
    with torch.no_grad():
        for k, clip in enumerate(clips):
            frames = np.stack([np.asarray(f.convert("RGB"), dtype=np.uint8) for f in clip.media])
            px = torch.as_tensor(normalize(frames, cfg.norm_mean, cfg.norm_std)).float()
            tokens = model.encode_tiles(px)  # (T, grid * grid, d)
            keep = evs(tokens.reshape(-1, tokens.shape[-1]), TokenLayout.video(len(frames), grid, grid), a.q).keep
            keep = keep.view(len(frames), grid * grid)
            size = frames.shape[1]
            for f, (x, y) in enumerate(clip.metadata["track"][1:], start=1):
                cell = position_bin(y, size, grid) * grid + position_bin(x, size, grid)
                mover_kept += int(keep[f, cell])
                later_frames += 1
            for f, c in keep[1:].nonzero().tolist():
                feats.append(tokens[f + 1, c])
                cells.append(c)
                clip_ids.append(k)
    x, y, ids = torch.stack(feats).float(), torch.tensor(cells), torch.tensor(clip_ids)
    train, test = ids < int(0.75 * a.clips), ids >= int(0.75 * a.clips)
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    x = (x - mu) / sd
    head = torch.nn.Linear(x.shape[1], grid * grid)
    opt = torch.optim.Adam(head.parameters(), 1e-2, weight_decay=1e-4)
    for _ in range(500):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(x[train]), y[train]).backward()
        opt.step()
    with torch.no_grad():
        acc = lambda s: float((head(x[s]).argmax(-1) == y[s]).float().mean())  # noqa: E731
        majority = float(torch.bincount(y[test], minlength=grid * grid).max()) / int(test.sum())
    print(f"model {a.model or default_model()}: {len(y)} EVS-kept tokens (q={a.q}, {a.frames}-frame direction "
          f"clips, frames 1..): cell read by a linear probe at {100 * acc(test):.1f}% on held-out clips "
          f"(train {100 * acc(train):.1f}%, majority class {100 * majority:.1f}%, chance {100 / grid ** 2:.1f}%)")
    print(f"EVS kept the moving shape's centre cell in {100 * mover_kept / later_frames:.1f}% of frames 1.. "
          f"({mover_kept} of the {len(y)} kept tokens, {len(y) / later_frames:.2f} kept a frame)")


if __name__ == "__main__":
    main()
