"""Samplers (data_recipes/samplers.py): plain epochs, RS2 subsets, weighted mixtures, resumable streams."""

import itertools
import math

import numpy as np
import pytest

from data_recipes.samplers import MixtureSampler, PlainSampler, RS2Sampler, block_schedule, make_sampler, stream
from vl.errors import ConfigError


def test_plain_epochs_are_fresh_permutations_and_deterministic():
    s = PlainSampler(50, seed=3)
    e0, e1 = s.epoch(0), s.epoch(1)
    assert sorted(e0) == list(range(50)) and sorted(e1) == list(range(50))
    assert list(e0) != list(e1)
    assert list(PlainSampler(50, seed=3).epoch(1)) == list(e1)
    assert list(PlainSampler(50, seed=4).epoch(1)) != list(e1)
    assert list(PlainSampler(5, shuffle=False).epoch(7)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n, fraction", [(100, 0.25), (103, 0.25), (10, 0.3), (7, 1.0)])
def test_rs2_new_subset_each_epoch_and_every_index_once_per_pass(n, fraction):
    s = RS2Sampler(n, fraction, seed=1)
    size = math.ceil(fraction * n)
    assert s.epoch_size == size
    per_pass = math.ceil(n / size)
    seen = []
    for e in range(per_pass):
        ep = s.epoch(e)
        assert len(ep) == size and len(set(ep.tolist())) == size  # no repeats inside an epoch
        assert all(0 <= i < n for i in ep)
        seen += ep.tolist()
    assert set(seen) == set(range(n))  # one pass covers the whole pool
    if n % size == 0:
        assert sorted(seen) == list(range(n))  # ... exactly once when the slices tile the pool
    if per_pass > 1:
        assert set(s.epoch(0).tolist()) != set(s.epoch(1).tolist())  # a new random subset
        assert set(s.epoch(0).tolist()) != set(s.epoch(per_pass).tolist())  # the next pass reshuffles


def test_stream_from_a_position_equals_the_tail_of_the_stream():
    for sampler in (PlainSampler(9, seed=2), RS2Sampler(20, 0.3, seed=5)):
        full = list(itertools.islice(stream(sampler), 60))
        for start in (0, 1, 9, 13, 41):
            assert list(itertools.islice(stream(sampler, start), 60 - start)) == full[start:]


def test_bad_sampler_arguments_are_errors():
    with pytest.raises(ConfigError):
        PlainSampler(0)
    with pytest.raises(ConfigError):
        RS2Sampler(10, 0.0)
    with pytest.raises(ConfigError):
        make_sampler("random", 10, 0)
    with pytest.raises(ConfigError):
        MixtureSampler([PlainSampler(3)], [1.0, 2.0])
    with pytest.raises(ConfigError):
        MixtureSampler([PlainSampler(3)], [0.0])


def test_block_schedule_has_exact_proportions():
    ids = block_schedule([3.0, 1.0, 0.5, 0.5], 1000, seed=0, b=4)
    counts = np.bincount(ids, minlength=4)
    assert counts.tolist() == [600, 200, 100, 100]
    odd = np.bincount(block_schedule([1, 1, 1], 100, 0, 0), minlength=3)
    assert odd.sum() == 100 and odd.max() - odd.min() <= 1
    assert block_schedule([1, 2], 64, 0, 0).tolist() != block_schedule([1, 2], 64, 0, 1).tolist()


def test_mixture_draws_each_source_in_its_own_order_and_resumes_exactly():
    def make():
        return MixtureSampler([PlainSampler(10, seed=1), RS2Sampler(40, 0.25, seed=2)], [1.0, 3.0], seed=7,
                              block=16)

    m = make()
    draws = m.take(64)
    assert sum(1 for s, _ in draws if s == 0) == 16  # exact 1:3 over whole blocks
    firsts = [i for s, i in draws if s == 0][:10]
    assert sorted(firsts) == list(range(10))  # source 0 walks its own epochs
    resumed = make()
    resumed.load_state_dict({"consumed": 37})
    assert resumed.take(27) == draws[37:]
    assert m.state_dict() == {"consumed": 64}
