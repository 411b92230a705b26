"""The residual-stream Hadamard fold computes the same function (QuaRot-style invariance) for every mixer kind."""

import copy

import pytest
import torch

from tiny_models import LM_VARIANTS, randomize_

from vl.config import LMConfig, tiny_vl
from vl.errors import ConfigError
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.modeling.vlm import MediaSpan, NemotronVL
from vl.quant.rotate import rotate_residual_stream


def _uneven_gains(model):
    """Gains far from 1, so that a fold that forgot a gain would show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and ".mixer." not in name:
                p.copy_(torch.rand(p.shape, generator=torch.Generator().manual_seed(len(name))) * 2)


def _lm(variant):
    opts = {k: v for k, v in LM_VARIANTS[variant].items()}
    opts["pattern"] = opts.pop("hybrid_override_pattern")
    lm = NemotronHForCausalLM(LMConfig(vocab_size=128, **opts)).eval()
    randomize_(lm, 0)
    _uneven_gains(lm)
    return lm


@pytest.mark.parametrize("variant", ["hybrid", "moe", "moe_latent"])
def test_rotated_lm_gives_the_same_logits(variant):
    lm = _lm(variant)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    rot = copy.deepcopy(lm)
    rotate_residual_stream(rot, seed=3)
    assert torch.allclose(rot(ids).logits, lm(ids).logits, atol=1e-4, rtol=1e-4)
    assert not torch.equal(rot.backbone.embeddings.weight, lm.backbone.embeddings.weight)
    assert all(torch.equal(b.norm.weight, torch.ones_like(b.norm.weight)) for b in rot.backbone.layers)


def test_rotated_vl_model_gives_the_same_logits_with_an_image():
    torch.manual_seed(0)
    model = NemotronVL(tiny_vl()).eval()
    randomize_(model.language_model, 0)
    _uneven_gains(model.language_model)
    ids = torch.randint(0, 290, (1, 20), generator=torch.Generator().manual_seed(2))
    ids[0, 3:7] = model.config.tokens.img_context_id
    tiles = torch.randn(1, 3, 64, 64)
    rot = copy.deepcopy(model)
    rotate_residual_stream(rot)
    a = model(ids, tiles, media=[MediaSpan("image", 1)]).logits
    b = rot(ids, tiles, media=[MediaSpan("image", 1)]).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_tied_embeddings_are_refused():
    lm = NemotronHForCausalLM(LMConfig(tie_word_embeddings=True))
    with pytest.raises(ConfigError, match="tied embeddings"):
        rotate_residual_stream(lm)
