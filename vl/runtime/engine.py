"""`vl.Engine`: messages in, a stream of reasoning/answer events out. Every user path goes through it.

The engine speaks tokens underneath (vl/runtime/generate.py) with the processor and the chat format on
top (nanochat `engine.py`). Model code stays plain math; placement happens at load time. The vision tower's
output is cached per image so a follow-up question on the same document does not re-encode it.
"""

from __future__ import annotations

import hashlib
import json
import resource
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from vl.errors import GenerationOptionError, InputError, StoppedError
from vl.processing.chat import ThinkSplitter, split_reasoning
from vl.processing.progress import Work
from vl.runtime.detokenize import IncrementalDecoder
from vl.runtime.generate import decode_step, generate_steps, left_pad, left_pad_embeds
from vl.runtime.placement import execution_device
from vl.runtime.reasoning import ReasoningBudget
from vl.runtime.sampling import SamplingParams

_PROCESSOR_KEYS = ("max_num_tiles", "fps", "max_frames", "pages", "pdf_scale", "context_length", "reserved_tokens",
                   "add_generation_prompt", "skip_blank_tiles")


@dataclass
class Event:
    kind: str  # "reasoning" | "answer"
    text: str


@dataclass
class Stats:
    prompt_tokens: int = 0  # tokens the LLM prefilled (after token reduction)
    vision_tokens_before: int = 0
    vision_tokens_after: int = 0
    new_tokens: int = 0
    time_to_first_token_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    total_s: float = 0.0
    peak_memory_bytes: int = 0  # CUDA: max allocated in this call; CPU: the process's peak RSS so far
    vision_cache_hits: int = 0
    notes: list[str] = field(default_factory=list)
    reductions: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # not what a caller attached (tensors)


@dataclass
class ChatResult:
    text: str  # the whole completion as generated (reasoning, `</think>`, answer)
    reasoning: str
    answer: str
    token_ids: list[int]
    stats: Stats
    finish_reason: str  # "stop" | "length" | "stop_string" | "cancelled" | "timeout"
    reasoning_truncated: bool = False  # generation ended inside the think block: no answer


class ChatStream:
    """Iterator of `Event`s; `.result` holds the `ChatResult` once the iteration has finished."""

    def __init__(self, gen):
        self._gen, self.result = gen, None

    def __iter__(self):
        self.result = yield from self._gen
        return self.result


class Engine:
    def __init__(self, model, processor, *, stop_ids=(), vision_cache_size: int = 32,
                 prefill_chunk: int | None = None,
                 decode: str = "auto"):
        """`decode`: how one-token steps run (vl/runtime/generate.py `decode_step`); "auto" = CUDA graphs on a
        GPU, eager on the CPU (where compiling costs a minute per model and shape family)."""
        self.model, self.processor = model, processor
        self.tokenizer = processor.tokenizer
        self.stop_ids = set(stop_ids) | processor.stop_token_ids()
        self.prefill_chunk = prefill_chunk
        self._vision_cache = VisionCache(vision_cache_size)
        self._lock = threading.Lock()
        if decode == "auto":
            decode = "cuda-graphs" if execution_device(model).type == "cuda" else "eager"
        decode_step(self.lm, decode)  # validates the name
        self.decode = decode

    @classmethod
    def from_pretrained(cls, path, dtype=None, device_map=None, video_pruning_rate=None, quant_mode=None,
                        decode: str = "auto", **processor_kwargs):
        import vl

        model = vl.load_pretrained(path, dtype=dtype, device_map=device_map, quant_mode=quant_mode)
        if video_pruning_rate is not None:
            model.config = model.config.replace(video_pruning_rate=float(video_pruning_rate))
        processor = vl.load_processor(path, **processor_kwargs)
        return cls(model, processor, stop_ids=_generation_stop_ids(path), decode=decode)

    @property
    def lm(self):
        return getattr(self.model, "language_model", self.model)

    @property
    def context_length(self) -> int:
        return self.lm.config.max_position_embeddings

    def _device(self):
        return execution_device(self.model)

    def _dtype(self):
        return self.lm.backbone.embeddings.weight.dtype

    def prepare(self, messages, *, thinking=None, video_pruning_rate=None, token_pruning_rate: float = 0.0,
                stats: Stats | None = None, work: Work | None = None, **proc):
        """messages -> (inputs_embeds (1, t, d), ProcessedInputs, Stats) with vision merged and reduced.

        `work`: the request's stop event and progress callback, current while media are read and encoded
        (vl/processing/progress.py); a stop there raises `StoppedError`."""
        stats = stats or Stats()
        proc.setdefault("context_length", self.context_length)
        with work or Work():
            inputs = self.processor(messages, thinking=thinking, **proc)
            stats.notes += inputs.notes
            embeds = embed_inputs(self.model, inputs.input_ids, inputs.pixel_values, inputs.media,
                                  video_pruning_rate, token_pruning_rate, self._vision_cache, stats)
        skipped = sum(len(i.tiles_skipped) for i in inputs.items)
        if skipped:  # blank tiles never reached the encoder; "before" counts them, so before -> after shows both
            stats.vision_tokens_before += skipped * self.processor.config.tokens_per_tile
        return embeds, inputs, stats

    # --- chat ----------------------------------------------------------------------------------------
    def chat(self, messages, *, max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
             top_k: int = 0, repetition_penalty: float = 1.0, seed: int | None = None, thinking=None,
             reasoning_budget: int | None = None, stop: list[str] | None = None, stream: bool = False,
             video_pruning_rate: float | None = None, token_pruning_rate: float = 0.0,
             cancel: threading.Event | None = None, timeout_s: float | None = None, progress=None,
             **processor_kwargs):
        """`cancel`: set it to stop the request at the next safe point (a page, a tile, a token): the result's
        `finish_reason` is then "cancelled". `progress(what, done, total)`: called while media are read and
        encoded (total 0 = unknown), so that long documents and videos can show "page 3/30"."""
        unknown = sorted(set(processor_kwargs) - set(_PROCESSOR_KEYS))
        if unknown:
            raise GenerationOptionError(f"unknown option(s) {unknown}; sampling: temperature, top_p, top_k, "
                                        f"repetition_penalty, seed; processing: {', '.join(_PROCESSOR_KEYS)}")
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        if reasoning_budget is not None and (not isinstance(reasoning_budget, int) or reasoning_budget < 0):
            raise GenerationOptionError(f"reasoning_budget must be an int >= 0, found {reasoning_budget!r}")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise GenerationOptionError(f"max_new_tokens must be a positive integer, found {max_new_tokens!r}")
        processor_kwargs["token_pruning_rate"] = token_pruning_rate
        processor_kwargs["work"] = Work(cancel, progress)
        gen = self._chat_events(messages, max_new_tokens, params, thinking, reasoning_budget, stop or [],
                                video_pruning_rate, cancel, timeout_s, processor_kwargs)
        if stream:
            return ChatStream(gen)
        s = ChatStream(gen)
        for _ in s:
            pass
        return s.result

    def _chat_events(self, messages, max_new_tokens, params, thinking, reasoning_budget, stop, video_pruning_rate,
                     cancel, timeout_s, proc):
        with self._lock:
            t0 = time.perf_counter()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            try:
                embeds, inputs, stats = self.prepare(messages, thinking=thinking,
                                                     video_pruning_rate=video_pruning_rate, **proc)
            except StoppedError:  # stopped before the first token: nothing was generated
                stats = Stats(total_s=time.perf_counter() - t0, notes=["stopped before the answer began"])
                return ChatResult("", "", "", [], stats, "cancelled")
            opened = inputs.prompt.prompt_opened_think
            budget = None if reasoning_budget is None else ReasoningBudget(self.tokenizer, reasoning_budget, opened)
            splitter, decoder = ThinkSplitter(opened), IncrementalDecoder(self.tokenizer)
            ids: list[int] = []
            text, finish, first = "", "length", None
            steps = generate_steps(self.lm, inputs_embeds=embeds, max_new_tokens=max_new_tokens, params=params,
                                   stop_ids=self.stop_ids, prefill_chunk=self.prefill_chunk,
                                   controllers=[budget], context_length=self.context_length,
                                   context_ids=inputs.input_ids, decode=self.decode)
            for ev in steps:
                tok = ev.tokens[0]
                first = first or time.perf_counter()
                if tok in self.stop_ids:
                    finish = "stop"
                    break
                ids.append(tok)
                piece = decoder.push(tok)
                hit = _find_stop(text + piece, stop, len(text))
                if hit is not None:
                    piece, finish = (text + piece)[:hit][len(text):], "stop_string"
                text += piece
                for kind, chunk in splitter.feed(piece):
                    yield Event(kind, chunk)
                if finish == "stop_string":
                    break
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    finish = "timeout"
                    break
            steps.close()
            if finish in ("length", "stop", "cancelled", "timeout"):
                tail = decoder.flush()
                text += tail
                for kind, chunk in splitter.feed(tail):
                    yield Event(kind, chunk)
            for kind, chunk in splitter.finish():
                yield Event(kind, chunk)
            end = time.perf_counter()
            reasoning, answer, truncated = split_reasoning(text, opened)
            stats.new_tokens = len(ids)
            stats.total_s = end - t0
            stats.time_to_first_token_s = (first or end) - t0
            if first and len(ids) > 1:
                stats.decode_tokens_per_s = (len(ids) - 1) / max(end - first, 1e-9)
            stats.peak_memory_bytes = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
                                       else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            if budget is not None and budget.forced:
                stats.notes.append(f"reasoning cut at the budget of {reasoning_budget} tokens")
            return ChatResult(text, reasoning, answer, ids, stats, finish, truncated)

    def chat_batch(self, conversations, **kwargs) -> list[ChatResult]:
        """Several conversations at once (left-padded); results equal running them one by one."""
        kwargs = dict(kwargs)
        if kwargs.pop("stream", False):
            raise GenerationOptionError("chat_batch does not stream; call chat(stream=True) per conversation")
        max_new_tokens = kwargs.pop("max_new_tokens", 256)
        thinking = kwargs.pop("thinking", None)
        vpr = kwargs.pop("video_pruning_rate", None)
        tpr = kwargs.pop("token_pruning_rate", 0.0)
        proc = {k: kwargs.pop(k) for k in list(kwargs) if k in _PROCESSOR_KEYS}
        for k in ("reasoning_budget", "stop", "cancel", "timeout_s"):
            if kwargs.get(k) is not None:
                raise GenerationOptionError(f"{k} is supported by chat(), not chat_batch()")
            kwargs.pop(k, None)
        params = SamplingParams.from_kwargs(**kwargs)
        with self._lock:
            t0 = time.perf_counter()
            prepared = [self.prepare(m, thinking=thinking, video_pruning_rate=vpr, token_pruning_rate=tpr, **proc)
                        for m in conversations]
            embeds, mask = left_pad_embeds([e[0] for e, _, _ in prepared])
            ctx, _ = left_pad([p.input_ids[0] for _, p, _ in prepared])
            rows = [[] for _ in prepared]
            first = None
            for ev in generate_steps(self.lm, inputs_embeds=embeds, attention_mask=mask,
                                     max_new_tokens=max_new_tokens, params=params, stop_ids=self.stop_ids,
                                     prefill_chunk=self.prefill_chunk, context_length=self.context_length,
                                     context_ids=ctx, decode=self.decode):
                first = first or time.perf_counter()
                for i, tok in enumerate(ev.tokens):
                    if tok is not None and tok not in self.stop_ids:
                        rows[i].append(tok)
            end = time.perf_counter()
        results = []
        for (_, inputs, stats), toks in zip(prepared, rows):
            text = self.tokenizer.decode(toks)
            reasoning, answer, truncated = split_reasoning(text, inputs.prompt.prompt_opened_think)
            stats.new_tokens, stats.total_s = len(toks), end - t0
            stats.time_to_first_token_s = (first or end) - t0
            finish = "length" if len(toks) >= max_new_tokens else "stop"
            results.append(ChatResult(text, reasoning, answer, toks, stats, finish, truncated))
        return results

    # --- tokens --------------------------------------------------------------------------------------
    def generate_ids(self, input_ids, max_new_tokens: int = 32, temperature: float = 0.0, attention_mask=None,
                     stop: bool = True, **sampling) -> torch.Tensor:
        """Token level, no processor (text-only prompts): new ids (b, n); stopped rows padded with the stop id."""
        from vl.runtime.generate import generate_ids

        with self._lock:
            return generate_ids(self.lm, input_ids.to(self._device()), attention_mask=attention_mask,
                                max_new_tokens=max_new_tokens, stop_ids=self.stop_ids if stop else (),
                                decode=self.decode,
                                temperature=temperature, **sampling)


def embed_inputs(model, input_ids, pixel_values=None, media=None, video_pruning_rate=None,
                 token_pruning_rate: float = 0.0, vision_cache: "VisionCache | None" = None,
                 stats: Stats | None = None) -> torch.Tensor:
    """Processed inputs of one prompt -> inputs_embeds (1, t', d): each media item through the vision tower
    on its own (through `vision_cache` when given), then token reduction and the placeholder merge."""
    lm = getattr(model, "language_model", model)
    device, dtype = execution_device(model), lm.backbone.embeddings.weight.dtype
    ids = input_ids.to(device)
    if not hasattr(model, "prepare_inputs"):
        if media:
            raise InputError("this is a text-only model; it takes no images or videos")
        embeds = lm.embed(ids)
    else:
        vectors = None
        if pixel_values is not None and media:
            outs, start, work = [], 0, Work.current()
            for span in media:
                work.report("encoding tiles", start, int(pixel_values.shape[0]))
                tiles = pixel_values[start:start + span.num_tiles]
                start += span.num_tiles
                encode = lambda t=tiles: model.encode_tiles(t.to(device, dtype))  # noqa: E731
                outs.append(vision_cache.get(tiles, span.kind, encode, stats) if vision_cache is not None
                            else encode())
            work.report("encoding tiles", start, int(pixel_values.shape[0]))
            vectors = torch.cat(outs)
        embeds, _, vision = model.prepare_inputs(ids, media=media, tile_vectors=vectors,
                                                 video_pruning_rate=video_pruning_rate,
                                                 token_pruning_rate=token_pruning_rate)
        if vision is not None and stats is not None:
            stats.vision_tokens_before = int(vision.vectors.shape[0])
            stats.vision_tokens_after = (int(vision.keep.sum()) if vision.keep is not None
                                         else stats.vision_tokens_before)
            stats.reductions = vision.info
            stats.vision_keep = vision.keep  # (n_placeholders,) bool | None: which tokens survived, for pictures
    if stats is not None:
        stats.prompt_tokens = int(embeds.shape[1])
    return embeds


class VisionCache:
    """Projected tile vectors per media item, keyed by the tiles' bytes: a follow-up question on the same
    image or document does not run the vision tower again. Least recently used entries go first."""

    def __init__(self, size: int = 32):
        self.size = size
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()

    def get(self, tiles: torch.Tensor, kind: str, encode, stats: Stats | None = None) -> torch.Tensor:
        key = hashlib.sha1(tiles.contiguous().numpy().tobytes()).hexdigest() + ":" + kind
        if key in self._items:
            self._items.move_to_end(key)
            if stats is not None:
                stats.vision_cache_hits += 1
            return self._items[key]
        value = self._items[key] = encode()
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value


def _find_stop(text: str, stops: list[str], searched_upto: int) -> int | None:
    """Index where the earliest stop string starts, looking only at text not already searched."""
    best = None
    for s in stops:
        if not s:
            continue
        i = text.find(s, max(0, searched_upto - len(s) + 1))
        if i != -1 and (best is None or i < best):
            best = i
    return best


def _generation_stop_ids(path) -> set[int]:
    """eos ids from generation_config.json (reference §11), if present."""
    from vl.checkpoint.load import resolve_dir

    f = Path(resolve_dir(path)) / "generation_config.json"
    if not f.exists():
        return set()
    eos = json.loads(f.read_text()).get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}
