"""A training run's log: the rows of `<out>/log.jsonl` and the loss curve drawn from them (`<out>/loss.png`)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_log(path: str | os.PathLike, upto_step: int | None = None) -> list[dict]:
    """The rows of a run's log.jsonl (none when it does not exist yet), up to `upto_step` when given."""
    path = Path(path)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if upto_step is None or r["step"] <= upto_step]


def plot_loss(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    steps = [r["step"] for r in rows]
    loss = [r["loss"] for r in rows]
    k = max(1, len(loss) // 50)
    smooth = [sum(loss[max(0, i - k + 1):i + 1]) / len(loss[max(0, i - k + 1):i + 1]) for i in range(len(loss))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, lw=0.6, alpha=0.35, label="per step")
    ax.plot(steps, smooth, lw=1.6, label=f"moving mean ({k} steps)")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / assistant token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
