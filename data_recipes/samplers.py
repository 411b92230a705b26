"""Index samplers: plain epochs, RS2 (repeated random subsets), and a weighted mixture over sources.

`PlainSampler`: every index of [0, n) once per epoch, in a fresh seeded permutation.
`RS2Sampler` follows Okanovic et al., "Repeated Random Sampling for Minimizing the Time-to-Accuracy of
Learning" (ICLR 2024; RS2 without replacement): each epoch trains on a new random subset of
`ceil(fraction * n)` examples; subsets are consecutive slices of one permutation, so every example is
seen once before any repeats, and a new permutation starts when one is used up.
`MixtureSampler` interleaves sources in exact proportion to their weights within each block of draws
(largest remainders, then a seeded shuffle), and asks each source's sampler for its next index.

Every order is a pure function of (seed, epoch / block), so a stream is resumed by position alone:
`state_dict()` is `{"consumed": k}` and `load_state_dict` replays the integer stream to k (no data is
rendered while replaying).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from vl.errors import ConfigError


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) for k in keys]))


class PlainSampler:
    """Each index once per epoch; `shuffle=False` keeps the natural order."""

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"sampler size must be an int >= 1, found {n!r}")
        self.n, self.seed, self.shuffle = n, seed, shuffle

    @property
    def epoch_size(self) -> int:
        return self.n

    def epoch(self, e: int) -> np.ndarray:
        return _rng(self.seed, e, 0x9A1).permutation(self.n) if self.shuffle else np.arange(self.n)

    def __iter__(self) -> Iterator[int]:
        return stream(self)


class RS2Sampler:
    """RS2 without replacement: epoch e is slice e mod (epochs per pass) of pass e // (epochs per pass)."""

    def __init__(self, n: int, fraction: float, seed: int = 0):
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"sampler size must be an int >= 1, found {n!r}")
        if not 0 < fraction <= 1:
            raise ConfigError(f"RS2 fraction must be in (0, 1], found {fraction!r}")
        self.n, self.fraction, self.seed = n, fraction, seed
        self.subset = max(1, math.ceil(fraction * n))
        self.per_pass = math.ceil(n / self.subset)  # epochs until every index has been drawn once

    @property
    def epoch_size(self) -> int:
        return self.subset

    def epoch(self, e: int) -> np.ndarray:
        p, k = divmod(e, self.per_pass)
        perm = _rng(self.seed, p, 0x852).permutation(self.n)
        chunk = perm[k * self.subset:(k + 1) * self.subset]
        if len(chunk) < self.subset:  # the last slice of a pass is short: top it up from the next pass
            nxt = _rng(self.seed, p + 1, 0x852).permutation(self.n)
            chunk = np.concatenate([chunk, nxt[~np.isin(nxt, chunk)][: self.subset - len(chunk)]])
        return _rng(self.seed, e, 0x853).permutation(chunk)  # the order within an epoch is fresh too

    def __iter__(self) -> Iterator[int]:
        return stream(self)


def stream(sampler, start: int = 0) -> Iterator[int]:
    """The sampler's infinite index stream from position `start` (whole epochs are skipped arithmetically)."""
    e, offset = divmod(start, sampler.epoch_size)
    while True:
        for i in sampler.epoch(e)[offset:]:
            yield int(i)
        e, offset = e + 1, 0


def make_sampler(kind: str, n: int, seed: int, fraction: float = 1.0):
    if kind == "plain":
        return PlainSampler(n, seed)
    if kind == "rs2":
        return RS2Sampler(n, fraction, seed)
    raise ConfigError(f"sampler must be 'plain' or 'rs2', found {kind!r}")


def block_schedule(weights: Sequence[float], block: int, seed: int, b: int) -> np.ndarray:
    """Source ids of block `b`: counts proportional to `weights` (largest remainders), seeded order."""
    w = np.asarray(weights, dtype=float)
    quota = w / w.sum() * block
    counts = np.floor(quota).astype(int)
    for i in np.argsort(-(quota - counts), kind="stable")[: block - counts.sum()]:
        counts[i] += 1
    ids = np.repeat(np.arange(len(w)), counts)
    return _rng(seed, b, 0x313).permutation(ids)


class MixtureSampler:
    """Stream of (source id, index within that source) pairs, sources in proportion to `weights`."""

    def __init__(self, samplers: Sequence, weights: Sequence[float], seed: int = 0, block: int = 1024):
        if len(samplers) != len(weights) or not samplers:
            raise ConfigError(f"need one weight per sampler; found {len(samplers)} samplers, {len(weights)} weights")
        if any(not w > 0 for w in weights):
            raise ConfigError(f"mixture weights must be > 0, found {list(weights)}")
        self.samplers, self.weights, self.seed, self.block = list(samplers), list(weights), seed, block
        self._restart(0)

    def _restart(self, consumed: int) -> None:
        self.consumed = 0
        self._streams = [stream(s) for s in self.samplers]
        self._schedule = self._source_ids()
        for _ in range(consumed):
            next(self)

    def _source_ids(self) -> Iterator[int]:
        b = 0
        while True:
            yield from (int(i) for i in block_schedule(self.weights, self.block, self.seed, b))
            b += 1

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, int]:
        source = next(self._schedule)
        self.consumed += 1
        return source, next(self._streams[source])

    def take(self, k: int) -> list[tuple[int, int]]:
        return [next(self) for _ in range(k)]

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self._restart(int(state["consumed"]))
