"""The fixed-shape decode step (for torch.compile / CUDA graphs) against the step with Python positions ("fused",
the default; "modules"); the old mode name "eager" reads as "fused" with a warning."""

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


def test_static_step_equals_fused_including_padded_batches(lm):
    ids = torch.randint(3, 128, (2, 21))
    assert tokens(lm, "static", input_ids=ids) == tokens(lm, "fused", input_ids=ids)
    ids, mask = left_pad([torch.randint(3, 128, (n,)) for n in (5, 17, 11)])
    assert tokens(lm, "static", input_ids=ids, attention_mask=mask) == \
        tokens(lm, "fused", input_ids=ids, attention_mask=mask)


def test_compiled_step_equals_fused(lm):
    ids = torch.randint(3, 128, (1, 9))
    assert tokens(lm, "compiled", input_ids=ids) == tokens(lm, "fused", input_ids=ids)


def test_the_modules_mode_gives_the_fused_tokens(lm):
    ids, mask = left_pad([torch.randint(3, 128, (n,)) for n in (5, 17, 11)])
    assert tokens(lm, "modules", input_ids=ids, attention_mask=mask) == \
        tokens(lm, "fused", input_ids=ids, attention_mask=mask)


def test_eager_the_old_name_of_fused_warns_at_the_callers_line_and_runs_fused(lm):
    """"eager" named the default step when on the CPU it already ran the fused C++ step: for one release it reads
    as "fused", with a DeprecationWarning pointing at the line that used it, wherever a mode is taken."""
    from vl.runtime.decode_batch import DecodeBatch
    from vl.runtime.generate import generate_ids

    ids = torch.randint(3, 128, (1, 9))
    with pytest.warns(DeprecationWarning, match="decode mode 'eager' is now 'fused'") as caught:
        old = tokens(lm, "eager", input_ids=ids)
        old_ids = generate_ids(lm, ids, max_new_tokens=4, decode="eager")
        assert DecodeBatch(lm, decode="eager").decode == "fused"
    assert old == tokens(lm, "fused", input_ids=ids)
    assert torch.equal(old_ids, generate_ids(lm, ids, max_new_tokens=4))
    assert {w.filename for w in caught} == {__file__}


def test_unknown_decode_mode_is_refused(lm):
    with pytest.raises(GenerationOptionError, match="decode mode 'fast'"):
        tokens(lm, "fast", input_ids=torch.randint(3, 128, (1, 4)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_cuda_graph_step_equals_modules_on_gpu(lm):
    gpu = lm.to("cuda")
    ids = torch.randint(3, 128, (1, 40), device="cuda")
    assert tokens(gpu, "cuda-graphs", input_ids=ids) == tokens(gpu, "modules", input_ids=ids)
    lm.to("cpu")
