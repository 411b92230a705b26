"""`vl.load_processor`: the processor of a checkpoint directory, from its small files only (no weights opened)."""

from __future__ import annotations

from transformers import AutoTokenizer

from vl.config import lm_config_from_hf, vl_config_from_hf, with_normalisation
from vl.config.omni import omni_config_from_hf
from vl.directory import checkpoint_kind, read_config, read_preprocessor, resolve_dir
from vl.processing.omni_processor import OmniProcessor
from vl.processing.processor import Processor
from vl.processing.text_processor import TextProcessor


def load_processor(path, **kwargs):
    """The processor for the checkpoint at `path`, from config.json, preprocessor_config.json and the tokenizer
    files only (no weights are opened): `Processor` for Nano V2 VL, `OmniProcessor` for Nemotron 3 Nano Omni,
    `TextProcessor` for text-only Nemotron-H.
    Dispatch is the loader's (`checkpoint_kind`: config.json fields, never folder names)."""
    directory = resolve_dir(path)
    raw = read_config(directory)
    where = str(directory / "config.json")
    kind = checkpoint_kind(raw, directory)
    if kind == "nemotron_h":
        cfg = lm_config_from_hf(raw, where=where)
        return TextProcessor(AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False), cfg, **kwargs)
    if kind == "nemotron_h_omni":
        return OmniProcessor.from_pretrained(directory, model=omni_config_from_hf(raw, where=where), **kwargs)
    # the same normalisation resolution as the loader, which also checks the weights' own buffers against it
    cfg = vl_config_from_hf(with_normalisation(raw, read_preprocessor(directory)), where=where)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    return Processor(tokenizer, cfg, **kwargs)
