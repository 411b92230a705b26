"""The synthetic families by name, split seeds and the lazy datasets over them (re-exported by the package)."""


from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from vl.errors import ConfigError

from .audio import AUDIO_FAMILIES
from .common import Sample
from .documents import DOC_FAMILIES
from .videos import VIDEO_FAMILIES

SEED_SPAN = 1_000_000_000
SPLIT_SEED_BASE = {"train": 0, "val": 1 * SEED_SPAN, "test": 2 * SEED_SPAN, "examples": 3 * SEED_SPAN}
KINDS = {"document": DOC_FAMILIES, "video": VIDEO_FAMILIES, "audio": AUDIO_FAMILIES}
COMMON_OPTIONS = ("tile_size",)


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    generate: Callable[..., Sample]
    classes: Callable[..., list[str]]
    options: tuple[str, ...]  # keyword options beyond tile_size

    def chance(self, **opts) -> float:
        """Accuracy of uniform guessing. video_order names both candidates in its question: 1/2."""
        return 0.5 if self.name == "video_order" else 1.0 / len(self.classes(**opts))


FAMILIES: dict[str, Family] = {
    name: Family(name, kind, gen, classes, options)
    for kind, table in KINDS.items()
    for name, (gen, classes, options) in table.items()
}


def families(kind: str) -> list[str]:
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {sorted(KINDS)}; found {kind!r}")
    return [name for name, fam in FAMILIES.items() if fam.kind == kind]


def split_seed(split: str, seed: int = 0) -> int:
    """The generator seed of `seed` within `split`; each split owns [base, base + SEED_SPAN)."""
    if split not in SPLIT_SEED_BASE:
        raise ConfigError(f"split must be one of {sorted(SPLIT_SEED_BASE)}; found {split!r}")
    if not isinstance(seed, int) or not 0 <= seed < SEED_SPAN:
        raise ConfigError(f"seed must be an int in [0, {SEED_SPAN}); found {seed!r}")
    return SPLIT_SEED_BASE[split] + seed


def _options_for(family: Family, opts: dict) -> dict:
    return {k: v for k, v in opts.items() if k in COMMON_OPTIONS or k in family.options}


def generate(family: str, split: str, index: int, *, seed: int = 0, **opts) -> Sample:
    """Sample `index` of one family in one split, with `split` and the chance level in its metadata."""
    if family not in FAMILIES:
        raise ConfigError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    fam = FAMILIES[family]
    unknown = set(opts) - set(COMMON_OPTIONS) - set(fam.options)
    if unknown:
        raise ConfigError(f"{family} takes options {COMMON_OPTIONS + fam.options}; found unknown {sorted(unknown)}")
    sample = fam.generate(split_seed(split, seed), index, **opts)
    return replace(sample, chance=fam.chance(**opts), metadata={**sample.metadata, "split": split, "id": sample.id})


class SyntheticDataset:
    """`n` samples of one kind, families interleaved round-robin; item j is rendered on access."""

    def __init__(self, kind: str, split: str, n: int, seed: int = 0, families_: list[str] | None = None, **opts):
        names = families(kind) if families_ is None else list(families_)
        bad = [f for f in names if f not in FAMILIES or FAMILIES[f].kind != kind]
        if bad or not names:
            raise ConfigError(f"families must be a non-empty subset of {families(kind)}; found {names}")
        accepted = set(COMMON_OPTIONS).union(*(FAMILIES[f].options for f in names))
        unknown = set(opts) - accepted
        if unknown:
            raise ConfigError(f"options for {kind} families {names} are {sorted(accepted)}; found {sorted(unknown)}")
        if not isinstance(n, int) or n < 0:
            raise ConfigError(f"n must be an int >= 0; found {n!r}")
        split_seed(split, seed)  # validates both
        self.kind, self.split, self.n, self.seed, self.families, self.opts = kind, split, n, seed, names, opts

    def __len__(self) -> int:
        return self.n

    def locate(self, j: int) -> tuple[str, int]:
        """(family, per-family index) of item j."""
        if not 0 <= j < self.n:
            raise IndexError(f"index {j} out of range for a dataset of {self.n}")
        return self.families[j % len(self.families)], j // len(self.families)

    def __getitem__(self, j: int) -> Sample:
        family, index = self.locate(j)
        opts = _options_for(FAMILIES[family], self.opts)
        return generate(family, self.split, index, seed=self.seed, **opts)

    def __iter__(self):
        return (self[j] for j in range(self.n))

    def chance_levels(self) -> dict[str, float]:
        return {f: FAMILIES[f].chance(**_options_for(FAMILIES[f], self.opts)) for f in self.families}


def make_dataset(kind: str, split: str, n: int, seed: int = 0, *, families: list[str] | None = None,
                 **opts) -> SyntheticDataset:
    """`n` samples of `kind` ("document" | "video" | "audio") from `split` ("train" | "val" | "test" | "examples").

    Options: tile_size (every kind, default 128; audio draws nothing with it); min_pages / max_pages (doc_multipage, default 2 / 10);
    num_frames / fps (videos, default 8 / 2.0).
    """
    return SyntheticDataset(kind, split, n, seed, families, **opts)
