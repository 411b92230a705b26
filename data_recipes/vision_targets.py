"""Per-tile auxiliary targets and linear probe heads: the demo model's stand-in for a pretrained vision tower.

Real VLM recipes start from a pretrained vision encoder (Nano V2 VL: C-RADIOv2-H) and only then teach the
LLM to read its tokens. The demo model's tower starts from random weights (nothing can be downloaded), and
measured on the 2-core build machine, next-token loss alone does not teach it to see within the time budget:
after ~6k samples the LM had learned the answer format and the class priors, the tower's features had
collapsed to a near-constant vector (gradient to the tower ~1e-4 of the LM's), and accuracy sat at chance
even on "what colour appears" (vl/demo/README.md, "How it was trained"). So the recipe gives the tower direct supervision:
every tile (a page or a frame) gets targets read off the generator's metadata - which label sits on each
form row and its digits or word, each table cell, each bar value, how many stars and boxes, where the moving
shape is, which colour just appeared, whether the lamp is lit - and linear heads on the projector's output
(all tokens of the tile, flattened, so position matters) are trained on them with cross entropy. The heads
are training-only: they are never saved with the model, which stays a plain Nano V2 VL checkpoint.

Every target is question-independent (it describes the picture, not the answer), so the LM still has to
learn which row, cell, bar or frame the question asks about; -1 marks "no target for this tile".
"""

from __future__ import annotations

import torch
from torch import nn

from data_recipes.synthetic import Sample
from data_recipes.synthetic.common import COLOURS, SHAPES
from data_recipes.synthetic.documents import LAYOUT_LABELS, NAME_DISTRACTORS, TOTAL_DISTRACTORS, WORDS

ROW_LABELS = tuple(dict.fromkeys(("TOTAL", *TOTAL_DISTRACTORS, "NAME", *NAME_DISTRACTORS, *LAYOUT_LABELS)))
PAGE_KINDS = ("doc_total", "doc_name", "doc_layout", "doc_table", "doc_chart_tallest", "doc_chart_value",
              "doc_count", "filler")
COLOUR_NAMES = tuple(COLOURS)
BINS = 6  # position bins per axis for the moving shape

HEADS: dict[str, int] = {"page_kind": len(PAGE_KINDS)}
for _r in range(3):
    HEADS |= {f"row{_r}_label": len(ROW_LABELS), f"row{_r}_tens": 10, f"row{_r}_units": 10,
              f"row{_r}_word": len(WORDS)}
HEADS |= {f"cell{_k}": 10 for _k in range(4)}
HEADS |= {f"bar{_k}_value": 5 for _k in range(3)}
HEADS |= {"tallest": 4, "n_star": 10, "n_box": 10, "mover_x": BINS, "mover_y": BINS,
          "new_colour": 1 + len(COLOUR_NAMES), "objects": 3, "lit": 2, "red_visible": 2, "other_visible": 2}
HEADS |= {f"shape_{s}": 2 for s in SHAPES}


def _rows(fields) -> dict[str, int]:
    out = {}
    for r, f in enumerate(fields):
        out[f"row{r}_label"] = ROW_LABELS.index(f["label"])
        value = f["value"]
        if value.isdigit() and len(value) == 2:
            out[f"row{r}_tens"], out[f"row{r}_units"] = int(value[0]), int(value[1])
        elif value in WORDS:
            out[f"row{r}_word"] = WORDS.index(value)
    return out


def position_bin(v: float, size: int, bins: int = BINS) -> int:
    """Which of `bins` equal bands of 0 .. size a coordinate falls in (the ends clamped)."""
    return min(bins - 1, max(0, int(v / size * bins)))


def tile_targets(sample: Sample, tile_size: int) -> list[dict[str, int]]:
    """One dict of head -> class per tile, in the processor's tile order (pages / frames in order, one tile
    each: the demo model runs with max_num_tiles=1 and keeps every frame of its clips)."""
    f, m, n = sample.family, sample.metadata, len(sample.media)
    if sample.kind == "document":
        if f == "doc_multipage":
            pages = [{"page_kind": PAGE_KINDS.index("filler")} for _ in range(n)]
            pages[m["answer_page"]] = {"page_kind": 0, **_rows(m["fields"])}
            return pages
        t = {"page_kind": PAGE_KINDS.index(f)}
        if f in ("doc_total", "doc_name", "doc_layout"):
            t |= _rows(m["fields"])
        elif f == "doc_table":
            t |= {f"cell{2 * r + c}": int(m["cells"][r][c]) for r in range(2) for c in range(2)}
        elif f == "doc_chart_value":
            t |= {f"bar{k}_value": int(v) - 1 for k, v in enumerate(m["values"])}
        elif f == "doc_chart_tallest":
            t["tallest"] = int(m["class_index"])
        elif f == "doc_count":
            kinds = [s["kind"] for s in m["shapes"]]
            t |= {"n_star": kinds.count("star"), "n_box": kinds.count("box")}
        return [t]
    frames = [dict() for _ in range(n)]
    if f == "video_direction":
        for i, (x, y) in enumerate(m["track"]):
            frames[i] |= {"mover_x": position_bin(x, tile_size), "mover_y": position_bin(y, tile_size)}
    elif f == "video_colour":
        colour = 1 + COLOUR_NAMES.index(sample.answer)
        for i in range(n):
            frames[i]["new_colour"] = colour if i >= m["appear_frame"] else 0
    elif f == "video_order":
        k1, k2 = m["appear_frames"]
        for i in range(n):
            shown = [s for s, k in zip(m["shapes"], (k1, k2)) if i >= k]
            frames[i] |= {"objects": len(shown), **{f"shape_{s}": int(s in shown) for s in SHAPES}}
    elif f == "video_flash":
        for i in range(n):
            frames[i]["lit"] = int(i in m["lit_frames"])
    elif f == "video_when":
        d = m["distractor"]
        for i in range(n):
            frames[i] |= {"red_visible": int(i >= m["appear_frame"]),
                          "other_visible": int(d is not None and i >= d["frame"])}
    return frames


class ProbeHeads(nn.Module):
    """One linear head per target over a tile's projected tokens, flattened: (N, tokens, d) -> logits."""

    def __init__(self, tokens_per_tile: int, hidden_size: int, heads: dict[str, int] = HEADS,
                 positions: bool = False):
        super().__init__()
        self.heads = nn.ModuleDict({k: nn.Linear(tokens_per_tile * hidden_size, n) for k, n in heads.items()})
        # `position_loss`'s head: one token alone -> its cell in the tile's grid (built only when a stage uses it)
        self.cell = nn.Linear(hidden_size, tokens_per_tile) if positions else None

    def forward(self, tile_vectors: torch.Tensor, names=None) -> dict[str, torch.Tensor]:
        """Logits of the heads in `names` (all when None)."""
        flat = tile_vectors.flatten(1).float()  # (N, tokens * d)
        return {k: self.heads[k](flat) for k in (self.heads if names is None else names)}


def probe_loss(probe: ProbeHeads, tile_vectors: torch.Tensor, targets: list[dict[str, int]]):
    """Mean over heads (that have any target here) of the mean cross entropy over their tiles.

    Returns (loss, {head: (correct, count)})."""
    if len(targets) != tile_vectors.shape[0]:
        raise ValueError(f"{len(targets)} target dicts for {tile_vectors.shape[0]} tiles")
    present = [k for k in probe.heads if any(k in t for t in targets)]  # a head with no target costs nothing
    losses, stats = [], {}
    for name, lg in probe(tile_vectors, present).items():
        idx = [i for i, t in enumerate(targets) if name in t]
        y = torch.tensor([targets[i][name] for i in idx], dtype=torch.long, device=lg.device)
        sel = lg[idx]
        losses.append(nn.functional.cross_entropy(sel, y))
        stats[name] = (int((sel.argmax(-1) == y).sum()), len(idx))
    loss = torch.stack(losses).mean() if losses else tile_vectors.sum() * 0.0
    return loss, stats


def position_loss(probe: ProbeHeads, tile_vectors: torch.Tensor):
    """Mean cross entropy of `probe.cell` reading each token's cell in its tile (0 .. tokens_per_tile - 1) from
    that token alone. The probe heads above see a tile's tokens flattened, so a tower trained on them may
    leave a token's place to its index, which EVS and token pruning throw away: on the from-scratch demo model, a
    linear probe reads the cell of an EVS-kept direction-clip token at 21% (majority class 21%). This loss asks
    every token to carry its place, as a pretrained RADIO's do (its position embedding survives the tower).

    Returns (loss, {"token_cell": (correct, count)})."""
    if probe.cell is None:
        raise ValueError("position_loss: the probe heads were built without positions=True")
    n, t, _ = tile_vectors.shape
    logits = probe.cell(tile_vectors.float()).reshape(n * t, t)
    y = torch.arange(t, device=logits.device).repeat(n)
    loss = nn.functional.cross_entropy(logits, y)
    return loss, {"token_cell": (int((logits.argmax(-1) == y).sum()), n * t)}
