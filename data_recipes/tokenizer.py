"""The demo model's tokenizer: a small byte-level BPE that carries the Nemotron Nano V2 VL control tokens.

It is saved in the same files the real checkpoints ship: `tokenizer.json`, plus `tokenizer_config.json` with
the `chat_template` in it. `transformers.AutoTokenizer.from_pretrained(dir)` therefore loads it as a
`PreTrainedTokenizerFast`, and everything downstream treats the demo model like the 12B one.
- Like the reference tokenizer, it never adds a BOS (docs/format.md §8.1). There is no post-processor, so even a plain
  `tokenizer(text)` adds nothing.
- `<think>` and `</think>` are single ids but not special. `decode(..., skip_special_tokens=True)` keeps
  them, and the think-tag splitter needs them.
- The chat template is `vl.processing.chat.CHAT_TEMPLATE`, the jinja twin of the Python renderer.
  The prompt format lives only in vl/processing/chat.py.
Built with the `tokenizers` library (BpeTrainer on a ByteLevel pre-tokenizer, as for GPT-2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from vl.errors import ConfigError
from vl.processing.chat import CHAT_TEMPLATE, DEFAULT_TOKENS, MediaTokens, TURN_TOKENS, THINK_CLOSE, THINK_OPEN

UNK, BOS, EOS_DOC, PAD = "<unk>", "<s>", "</s>", "<pad>"
END_OF_TURN = TURN_TOKENS[2]  # <SPECIAL_12>: the eos a chat generation stops on
BYTE_ALPHABET = 256


def control_tokens(tokens: MediaTokens = DEFAULT_TOKENS) -> tuple[str, ...]:
    """Special tokens, in id order from 0 (the reference vocab also keeps its control tokens at the low ids)."""
    return (UNK, BOS, EOS_DOC, PAD, *TURN_TOKENS, tokens.img_start, tokens.img_end, tokens.img_context,
            tokens.video_context)


TEXT_TAGS = (THINK_OPEN, THINK_CLOSE)


def build_tokenizer(texts: Iterable[str], vocab_size: int, *, tokens: MediaTokens = DEFAULT_TOKENS,
                    min_frequency: int = 2):
    """Trains the BPE in memory and wraps it as a `PreTrainedTokenizerFast` with our chat template.

    `vocab_size` counts everything: the byte alphabet, the control tokens, the think tags and the merges.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = control_tokens(tokens)
    smallest = BYTE_ALPHABET + len(specials) + len(TEXT_TAGS)
    if not isinstance(vocab_size, int) or vocab_size < smallest:
        raise ConfigError(f"vocab_size must be an int >= {smallest} (256 bytes + {len(specials)} control tokens "
                          f"+ 2 think tags), found {vocab_size!r}")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(TEXT_TAGS), min_frequency=min_frequency,
                                  special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    count = 0

    def counted():
        nonlocal count
        for text in texts:
            if not isinstance(text, str):
                raise ConfigError(f"training texts must be strings, found {type(text).__name__}")
            count += 1
            yield text

    bpe.train_from_iterator(counted(), trainer)
    if count == 0:
        raise ConfigError("train_tokenizer got no texts; pass an iterable of training strings")
    bpe.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TEXT_TAGS])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token=UNK, bos_token=BOS, eos_token=END_OF_TURN,
                                        pad_token=PAD, clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer, out_dir: str | os.PathLike) -> Path:
    """Standard files, the chat template inside tokenizer_config.json, where every loader looks for it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = tokenizer.chat_template
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # not the transformers-5-only "TokenizersBackend"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").unlink(missing_ok=True)  # one copy only: the config is the source
    return out


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, *,
                    tokens: MediaTokens = DEFAULT_TOKENS, min_frequency: int = 2):
    """Trains, saves to `out_dir` and returns the tokenizer as `AutoTokenizer` loads it back."""
    from transformers import AutoTokenizer

    save_tokenizer(build_tokenizer(texts, vocab_size, tokens=tokens, min_frequency=min_frequency), out_dir)
    return AutoTokenizer.from_pretrained(str(out_dir))
