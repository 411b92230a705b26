"""The fixed-shape decode step (for torch.compile / CUDA graphs) against the eager reference step."""

import pytest
import torch

import vl
from tiny_models import save_hf_nemotron
from vl.errors import GenerationOptionError
from vl.runtime.generate import generate_steps, left_pad


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path, _ = save_hf_nemotron(tmp_path_factory.mktemp("lm"), "hybrid")
    return vl.load_pretrained(path)


def tokens(lm, mode, **kw):
    return [ev.tokens for ev in generate_steps(lm, max_new_tokens=12, decode=mode, **kw)]


def test_static_step_equals_eager_including_padded_batches(lm):
    ids = torch.randint(3, 128, (2, 21))
    assert tokens(lm, "static", input_ids=ids) == tokens(lm, "eager", input_ids=ids)
    ids, mask = left_pad([torch.randint(3, 128, (n,)) for n in (5, 17, 11)])
    assert tokens(lm, "static", input_ids=ids, attention_mask=mask) == \
        tokens(lm, "eager", input_ids=ids, attention_mask=mask)


def test_compiled_step_equals_eager(lm):
    ids = torch.randint(3, 128, (1, 9))
    assert tokens(lm, "compiled", input_ids=ids) == tokens(lm, "eager", input_ids=ids)


def test_unknown_decode_mode_is_refused(lm):
    with pytest.raises(GenerationOptionError, match="decode mode 'fast'"):
        tokens(lm, "fast", input_ids=torch.randint(3, 128, (1, 4)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_cuda_graph_step_equals_eager_on_gpu(lm):
    gpu = lm.to("cuda")
    ids = torch.randint(3, 128, (1, 40), device="cuda")
    assert tokens(gpu, "cuda-graphs", input_ids=ids) == tokens(gpu, "eager", input_ids=ids)
    lm.to("cpu")
