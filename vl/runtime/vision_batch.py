"""The tiles of several requests through the vision tower in one call, for requests that join a batch together.

A server that prefills the requests arriving together in one left-padded call (vl/runtime/batch.py) can also
encode their images together: on a small model every tower call costs about the same whatever its batch, and on
a large one a fuller batch keeps the device busy (vLLM batches the encoder inputs of a scheduling step the same
way). The tower sees each tile on its own (a ViT attends within a tile), so a tile's vectors do not depend on the
others in its call; `tests/runtime/test_vision_batch.py` holds that the answers equal single runs.

`GroupVision` looks like the engine's `VisionCache` to `embed_inputs` (vl/runtime/engine.py): the group's
tiles that the cache does not hold are encoded at once when it is built, and each request then takes its own
vectors from it, so the merge, token reduction and the statistics stay the single-request code.
"""

from __future__ import annotations

import torch

from vl.runtime.cpu import encoder_pages

MAX_TILES = 64  # tiles per grouped call: the group's pixels are copied into one tensor first (a video can have 100+ frames)


class GroupVision:
    def __init__(self, engine, inputs: list):
        """`inputs`: the `ProcessedInputs` of the requests joining together (vl/processing/processor.py)."""
        self.cache = engine._vision_cache  # a VisionCache (vl/runtime/engine.py)
        self.fresh: dict[str, torch.Tensor] = {}  # key -> (tiles, tokens, d): encoded here, not yet handed out
        self._keys: dict[tuple, str] = {}
        model = engine.model
        if not hasattr(model, "encode_tiles"):
            return
        keys, parts, total = [], [], 0
        for inp in inputs:
            for tiles, kind in _spans(inp):
                key = self._key(tiles, kind)
                if key in self.cache or key in keys or (parts and total + int(tiles.shape[0]) > MAX_TILES):
                    continue  # cached, already in the group, or over the cap: encoded on its own when used
                keys.append(key)
                parts.append(tiles)
                total += int(tiles.shape[0])
        if not parts:
            return
        with encoder_pages.in_memory(model, encoder_pages.VISION) as tower:
            out = tower.wrap(lambda: model.encode_tiles(torch.cat(parts).to(engine._device(), engine._dtype())))()
        for key, vec in zip(keys, torch.split(out, [int(p.shape[0]) for p in parts])):
            self.fresh[key] = vec

    def _key(self, tiles: torch.Tensor, kind: str) -> str:
        """The cache's content key, computed once per tile span of this group (hashing a big tile costs)."""
        ident = (tiles.data_ptr(), tuple(tiles.shape), kind)
        if ident not in self._keys:
            self._keys[ident] = self.cache.key(tiles, kind)
        return self._keys[ident]

    def get(self, tiles: torch.Tensor, kind: str, encode, stats=None) -> torch.Tensor:
        """As `VisionCache.get`: the first request to use a freshly encoded item takes it (and the cache keeps
        it), a second one finds it in the cache (a hit, as when the requests ran one after the other)."""
        key = self._key(tiles, kind)
        vec = self.fresh.pop(key, None)
        if vec is not None:
            return self.cache.put(key, vec)
        return self.cache.get(tiles, kind, encode, stats, key=key)


def _spans(inputs):
    """(tiles, kind) of each media item of one request, sliced as `embed_inputs` slices them."""
    pixels, start = inputs.pixel_values, 0
    if pixels is None:
        return
    for span in inputs.media or ():
        yield pixels[start:start + span.num_tiles], span.kind
        start += span.num_tiles
