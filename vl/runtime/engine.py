"""`vl.Engine`: messages in, a stream of reasoning/answer events out. Every user path goes through it.

The engine speaks tokens underneath (vl/runtime/generate.py) with the processor and the chat format on
top (nanochat `engine.py`). Model code stays plain math; placement happens at load time. The vision tower's
output is cached per image so a follow-up question on the same document does not re-encode it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from pathlib import Path

import torch

from vl.directory import resolve_dir
from vl.errors import GenerationOptionError, InputError, VLError, naming
from vl.processing.load import load_processor
from vl.processing.omni_processor import OmniInputs
from vl.processing.progress import Work
from vl.options import RequestOptions, canonical, spec
from vl.runtime.batch import ChatRequest, Tokenized, run_batch
from vl.runtime.cpu import encoder_pages
from vl.runtime.generate import decode_mode, decode_step, generate_ids
from vl.runtime.omni_inputs import embed_omni
from vl.runtime.placement import execution_device
from vl.runtime.pretrained import load_pretrained
from vl.runtime.results import ChatResult, ChatStream, Event, Stats  # noqa: F401 - part of the engine's API
from vl.runtime.sampling import SamplingParams



class Engine:
    def __init__(self, model, processor, *, stop_ids=(), vision_cache_size: int = 32,
                 prefill_chunk: int | None = None, mix_chunk: int | None = None,
                 decode: str = "auto"):
        """`decode`: how one-token steps run (vl/runtime/decode_step.py `decode_step`); "auto" = CUDA graphs on a
        GPU, "fused" on the CPU (where compiling costs a minute per model and shape family). `mix_chunk`: tokens of a
        prompt that joins running rows prefilled per decode step (vl/runtime/decode_batch.py; 0: at once; None: on the
        CPU's fused step as many as keep the step within 60% more than the running rows' own, else 64 / 512 on CUDA)."""
        self.model, self.processor = model, processor
        self.tokenizer = processor.tokenizer
        self.stop_ids = set(stop_ids) | processor.stop_token_ids()
        self.prefill_chunk = prefill_chunk
        self.mix_chunk = mix_chunk  # tokens of a joining prompt prefilled per decode step (None: the device's default)
        self._vision_cache = VisionCache(vision_cache_size)
        self._lock = threading.Lock()
        if decode == "auto":
            decode = "cuda-graphs" if execution_device(model).type == "cuda" else "fused"
        decode = decode_mode(decode)  # "eager" warns and reads as "fused"
        decode_step(self.lm, decode)  # validates the name
        self.decode = decode

    @classmethod
    def from_pretrained(cls, path, dtype=None, device_map=None, video_pruning_rate=None, quant_mode=None,
                        decode: str = "auto", **processor_kwargs):
        decode = decode if decode == "auto" else decode_mode(decode)  # "eager" warns here, at the caller's line
        video_pruning_rate = spec("video_pruning_rate").check(video_pruning_rate)  # the request option's range
        model = load_pretrained(path, dtype=dtype, device_map=device_map, quant_mode=quant_mode)
        if video_pruning_rate is not None and hasattr(model.config, "video_pruning_rate"):  # text-only: no video
            model.config = model.config.replace(video_pruning_rate=float(video_pruning_rate))
        processor = load_processor(path, **processor_kwargs)
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

    def prepare(self, messages, options: RequestOptions | None = None, *, stats: Stats | None = None,
                work: Work | None = None):
        """messages -> (inputs_embeds (1, t, d), ProcessedInputs, Stats) with vision merged and reduced; a
        `Tokenized` prompt (already processed: the transformers pipeline's) skips the processor and comes back as
        the inputs.

        `options`: the request's media and reduction options (vl/options.py). `work`: the request's stop event
        and progress callback, current while media are read and encoded (vl/processing/progress.py); a stop
        there raises `StoppedError`."""
        options = options or RequestOptions()
        work = work or Work()
        inputs, stats = self.process(messages, options, stats=stats, work=work)
        embeds = self.embed(inputs, stats, options, work=work)
        return embeds, inputs, stats

    def process(self, messages, options: RequestOptions | None = None, *, stats: Stats | None = None,
                work: Work | None = None):
        """The first half of `prepare`: messages -> (ProcessedInputs, Stats) (media decoded and tiled, prompt ids).
        It calls no model, so a server may run it off the engine's thread (vl/server/scheduler.py)."""
        options = options or RequestOptions()
        stats = stats or Stats()
        if isinstance(messages, Tokenized):
            return messages, stats
        proc = options.processor_kwargs()
        proc.setdefault("context_length", self.context_length)
        start = time.perf_counter()
        with work or Work():
            inputs = self.processor(messages, thinking=options.thinking, **proc)
        stats.notes += inputs.notes
        stats.stages_s["media"] = time.perf_counter() - start
        return inputs, stats

    def embed(self, inputs, stats: Stats, options: RequestOptions | None = None, *, work: Work | None = None,
              vision_cache=None) -> torch.Tensor:
        """The second half of `prepare`: vision tower, token reduction and the merge -> inputs_embeds (1, t, d).
        `vision_cache`: where encoded tiles are looked up (default the engine's; vl/runtime/vision_batch.py
        hands in the tiles of several requests encoded in one call)."""
        options = options or RequestOptions()
        cache = self._vision_cache if vision_cache is None else vision_cache
        if isinstance(inputs, OmniInputs):
            with work or Work():
                return embed_omni(self.model, inputs, options.video_pruning_rate, cache, stats)
        start = time.perf_counter()
        with work or Work():
            embeds = embed_inputs(self.model, inputs.input_ids, inputs.pixel_values, inputs.media,
                                  options.video_pruning_rate, options.token_pruning_rate,
                                  cache, stats)
        if inputs.pixel_values is not None:
            stats.stages_s["vision"] = time.perf_counter() - start
        skipped = sum(len(i.tiles_skipped) for i in getattr(inputs, "items", ()))
        if skipped:  # blank tiles never reached the encoder; "before" counts them, so before -> after shows both
            stats.vision_tokens_before += skipped * self.processor.config.tokens_per_tile
        return embeds

    # --- chat ----------------------------------------------------------------------------------------
    def chat(self, messages, options: RequestOptions | None = None, *, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, repetition_penalty: float = 1.0, seed: int | None = None,
             stop: list[str] | None = None, stream: bool = False, cancel: threading.Event | None = None,
             timeout_s: float | None = None, progress=None, **option_kwargs):
        """One conversation. Its options are a `RequestOptions` (vl/options.py) and/or their keywords
        (`max_new_tokens=`, `thinking=`, `max_num_tiles=`, `video_pruning_rate=`, ...: any option by its name or
        a declared alias, read over `options`). `cancel`: set it to stop the request at the next safe point (a
        page, a tile, a token): the result's `finish_reason` is then "cancelled". `progress(what, done, total)`:
        called while media are read and encoded (total 0 = unknown), so that long documents and videos can
        show "page 3/30"."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        request = ChatRequest(messages, options, stop=stop, cancel=cancel, timeout_s=timeout_s, progress=progress,
                              **option_kwargs)
        s = ChatStream(self._chat_events(request, params))
        if stream:
            return s
        for _ in s:
            pass
        return s.result

    def _chat_events(self, request: ChatRequest, params: SamplingParams):
        result = None
        for _, item in run_batch(self, [request], params):
            if isinstance(item, Event):
                yield item
            else:
                result = item
        return result

    def chat_batch(self, conversations, options: RequestOptions | None = None, **kwargs) -> list[ChatResult]:
        """Several conversations at once (left-padded), with the same options; results equal running them one
        by one. Keywords: sampling (`temperature`, ...), `stop`, `cancel`, `timeout_s`, and option keywords.
        A conversation that cannot run raises its typed error, named by its place when there are several
        ("conversation 2 of 3: ..."); `stream_batch` instead reports it and lets the others finish."""
        kwargs = dict(kwargs)
        if kwargs.pop("stream", False):
            raise GenerationOptionError("chat_batch does not stream; call chat(stream=True) per conversation, "
                                        "or stream_batch()")
        shared = {k: kwargs.pop(k) for k in ("cancel", "timeout_s") if k in kwargs}
        stop = list(kwargs.pop("stop", None) or [])
        option_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if canonical(k) is not None}
        options = RequestOptions.from_kwargs(options, **option_kwargs)
        params = SamplingParams.from_kwargs(**kwargs)
        requests = [ChatRequest(m, options, stop=list(stop), **shared) for m in conversations]
        results: list = [None] * len(requests)
        for i, item in self.stream_batch(requests, params, raise_errors=False):
            if isinstance(item, VLError):
                with naming(f"conversation {i + 1} of {len(requests)}" if len(requests) > 1 else None):
                    raise item
            if isinstance(item, ChatResult):
                results[i] = item
        return results

    def stream_batch(self, requests: list[ChatRequest], params: SamplingParams = SamplingParams(), *,
                     raise_errors: bool = False, more=None, processed=None):
        """Requests with their own options, decoded together (vl/runtime/batch.py): yields `(i, Event)`,
        `(i, ChatResult)` when request i ends, and `(i, VLError)` for a request that could not be prepared
        (unless `raise_errors`). `more(running)` hands over requests that join between decode steps
        (continuous batching); `processed(request)` hands over media processed ahead (`process`). The
        server's batches go through here."""
        return run_batch(self, requests, params, raise_errors=raise_errors, more=more, processed=processed)

    # --- tokens --------------------------------------------------------------------------------------
    def generate_ids(self, input_ids, max_new_tokens: int = 32, temperature: float = 0.0, attention_mask=None,
                     stop: bool = True, **sampling) -> torch.Tensor:
        """Token level, no processor (text-only prompts): new ids (b, n); stopped rows padded with the stop id."""
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
            with encoder_pages.in_memory(model, encoder_pages.VISION) as tower:
                for span in media:
                    work.report("encoding tiles", start, int(pixel_values.shape[0]))
                    tiles = pixel_values[start:start + span.num_tiles]
                    start += span.num_tiles
                    encode = tower.wrap(lambda t=tiles: model.encode_tiles(t.to(device, dtype)))
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
            stats.notes += [r["note"] for r in vision.info if r.get("note")]  # e.g. a similarity floor kept tokens
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

    @staticmethod
    def key(tiles: torch.Tensor, kind: str) -> str:
        data = tiles.detach().contiguous().cpu()  # any dtype (the pipeline hands bf16 tiles) and device: hash bytes
        return f"{hashlib.sha1(data.view(torch.uint8).numpy().tobytes()).hexdigest()}:{data.dtype}:{kind}"

    def get(self, tiles: torch.Tensor, kind: str, encode, stats: Stats | None = None, key: str | None = None):
        key = key or self.key(tiles, kind)
        if key in self._items:
            self._items.move_to_end(key)
            if stats is not None:
                stats.vision_cache_hits += 1
            return self._items[key]
        return self.put(key, encode())

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def put(self, key: str, value: torch.Tensor) -> torch.Tensor:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value


def _generation_stop_ids(path) -> set[int]:
    """eos ids from generation_config.json (docs/format.md §2.3), if present."""
    f = Path(resolve_dir(path)) / "generation_config.json"
    if not f.exists():
        return set()
    eos = json.loads(f.read_text()).get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {int(eos)}
