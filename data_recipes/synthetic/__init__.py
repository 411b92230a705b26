"""Deterministic synthetic documents and clips with known answers, for training and evaluating the demo model.

    from data_recipes.synthetic import make_dataset
    train = make_dataset("document", "train", 10_000, seed=0, tile_size=128)
    sample = train[3]          # Sample(question, answer, reasoning, media=[PIL pages], chance, metadata)

Splits own disjoint seed ranges (`SPLIT_SEED_BASE`): a sample's random stream is keyed by
`(SPLIT_SEED_BASE[split] + seed, family, index)`, so test samples are never train samples whatever `n`.
Families are interleaved round-robin (balanced), and within a family every answer class occurs equally
often over each block of `n_classes` consecutive samples. Datasets are lazy: `ds[i]` renders sample i.
"""

from .common import Sample, frame_time_str
from .export import export_split, write_examples, write_mp4, write_pdf
from .families import (FAMILIES, KINDS, SEED_SPAN, SPLIT_SEED_BASE, Family, SyntheticDataset, families, generate,
                       make_dataset, split_seed)

__all__ = [
    "FAMILIES", "Family", "KINDS", "SEED_SPAN", "SPLIT_SEED_BASE", "Sample", "SyntheticDataset", "export_split",
    "families", "frame_time_str", "generate", "make_dataset", "split_seed", "write_examples", "write_mp4",
    "write_pdf",
]
