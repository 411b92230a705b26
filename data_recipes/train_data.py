"""The data side of `vl train-demo` (data_recipes/train.py): the recipe's tokenizer and processor, its mixture of
synthetic sources as a resumable stream of formatted examples (`SampleStream`), the next step's examples built on
a background thread while the current step trains (`Prefetch`), and a step's examples packed into forward passes
(`step_batches`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data_recipes.formatting import choose_thinking, format_example, tokenizer_corpus
from data_recipes.packing import Batch, collate, efficiency, pack
from data_recipes.registry import Recipe
from data_recipes.samplers import MixtureSampler, make_sampler
from data_recipes.synthetic import generate
from data_recipes.vision_targets import tile_targets


def training_processor(tokenizer, config):
    """The inference `Processor` with its default limits and timestamp convention."""
    from vl.processing.processor import Processor

    return Processor(tokenizer, config)


def load_or_train_tokenizer(recipe: Recipe, directory: Path):
    """The recipe's BPE, trained once on rendered train-split conversations and kept in `directory`."""
    from transformers import AutoTokenizer

    from data_recipes.tokenizer import train_tokenizer

    if recipe.init_from:
        return AutoTokenizer.from_pretrained(recipe.init_from)
    if (directory / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(directory))
    samples = [generate(s.family, "train", i, seed=recipe.data_seed, tile_size=recipe.model.tile_size,
                        **dict(s.options))
               for s in recipe.sources for i in range(recipe.tokenizer_samples_per_family)]
    return train_tokenizer(tokenizer_corpus(samples), recipe.model.vocab_size, directory)


class SampleStream:
    """The recipe's mixture of synthetic sources as a resumable stream of formatted examples."""

    def __init__(self, recipe: Recipe, processor):
        self.recipe, self.processor = recipe, processor
        samplers = [make_sampler(recipe.sampler, s.pool, recipe.seed * 1000 + k, recipe.rs2_fraction)
                    for k, s in enumerate(recipe.sources)]
        self.mixture = MixtureSampler(samplers, [s.weight for s in recipe.sources], seed=recipe.seed)

    def _example(self, source, index: int, tower_only: bool = False):
        """One train-split sample, formatted (/think by the recipe's share, or never for a tower-only one),
        with its per-tile probe targets."""
        sample = generate(source.family, "train", index, seed=self.recipe.data_seed,
                          tile_size=self.recipe.model.tile_size, **dict(source.options))
        thinking = not tower_only and choose_thinking(sample.id, self.recipe.think_fraction, self.recipe.seed)
        example = format_example(sample, self.processor, thinking=thinking)
        example.meta["tile_targets"] = tile_targets(sample, self.recipe.model.tile_size)
        return example

    def next_examples(self, k: int):
        """The next `k` examples of the mixture, formatted, with their per-tile probe targets."""
        return [self._example(self.recipe.sources[source_id], index) for source_id, index in self.mixture.take(k)]

    def probe_examples(self, step: int, k: int):
        """Step `step`'s `k` tower-only examples: sources by `probe_sources` weight and train-split indices in
        [0, pool), drawn from a generator keyed by (seed, step), so a resumed run redraws the same ones."""
        if k == 0:
            return []
        sources = self.recipe.probe_sources
        rng = np.random.default_rng((self.recipe.seed, 0x9E0BE, step))
        weights = np.array([s.weight for s in sources], dtype=np.float64)
        picks = rng.choice(len(sources), size=k, p=weights / weights.sum())
        return [self._example(sources[j], int(rng.integers(sources[j].pool)), tower_only=True) for j in picks]

    def step_examples(self, step: int):
        """Optimizer step `step`'s (mixture examples, tower-only probe examples)."""
        stage, _ = self.recipe.stage_at(step)
        return (self.next_examples(stage.samples_per_step or self.recipe.samples_per_step),
                self.probe_examples(step, stage.probe_samples))


class Prefetch:
    """Builds the next step's examples on one background thread while the current step trains.

    Rendering a step's pages and clips is Python and PIL on one core (~0.3 s a step on the demo recipe) while
    the other core waits; overlapped, it comes off the step time. The examples and their order are those of
    `SampleStream.step_examples` called step after step (nothing in them depends on timing), so a run with and
    without prefetch computes the same losses. `get` returns (mixture examples, tower-only probe examples,
    samples consumed by the mixture after them)."""

    def __init__(self, data: SampleStream, enabled: bool = True):
        from concurrent.futures import ThreadPoolExecutor

        self.data = data
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if enabled else None
        self.pending: tuple[int, object] | None = None

    def _build(self, step: int):
        examples, probe_examples = self.data.step_examples(step)
        return examples, probe_examples, self.data.mixture.consumed

    def get(self, step: int, next_step: int | None):
        """Step `step`'s examples; starts building `next_step`'s (None: there is no next step)."""
        if self.pending is not None:
            want, future = self.pending
            if want != step:  # callers always ask for the step they announced; anything else is a bug here
                raise RuntimeError(f"prefetched step {want}, asked for step {step}")
            out = future.result()
        else:
            out = self._build(step)
        self.pending = None
        if self.pool is not None and next_step is not None:
            self.pending = (next_step, self.pool.submit(self._build, next_step))
        return out

    def close(self):
        """Waits for a build in flight (its samples are not counted: the checkpoint holds the consumed count of
        the last trained step) and stops the thread."""
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.pending = None


def step_batches(examples, recipe: Recipe, pad_id: int) -> tuple[list[Batch], float]:
    lengths = [len(e) for e in examples]
    groups = pack(lengths, recipe.packing.max_tokens, recipe.packing.max_seq_len)
    return [collate([examples[i] for i in g], pad_id) for g in groups], efficiency(lengths, groups)
