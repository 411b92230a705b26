"""Checkpoint files: safetensors only, checked before anything is allocated.

Rules (docs/reliability_policy.md §2): pickle files (`.bin`, `.pt`, `.pth`, `.ckpt`, `.pkl`) are refused and
never opened; each safetensors header is validated by our own pre-check (length against the file size, a
size cap, duplicate names, dtype/shape/offset consistency, no gaps or overlaps) before any tensor is read at
those offsets; a sharded index must agree with its shards.

Where loaded tensors live (docs/checkpoints.md, "Memory on a CPU"): `load_all` reads each tensor into the
process's own (anonymous) memory with a plain file read, so the weights a forward pass reads on every token
cannot be dropped by the kernel under memory pressure and faulted back from disk a page at a time (a
memory-mapped 12B model decoded at disk speed on a loaded machine). Names passed as `mapped` are instead
views of a copy-on-write memory map of their byte range, advised for random access: the loader uses this for
embedding tables, of which a forward reads a few rows, so a token's row costs a page or two read from disk,
never the whole table in memory nor the kernel's multi-megabyte read-around. Names passed as `whole` are mapped
the same way with normal read-ahead: encoder weights that the runtime maps in for each encoder call and drops
after it, where the LLM nearly fills the machine (vl/runtime/cpu/encoder_pages.py). All give the same bytes.
"""

from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vl.errors import CheckpointError, UnsafeCheckpointError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_HEADER_BYTES = 100 * 1024 * 1024
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

DTYPE_SIZES = {  # safetensors dtype code -> (torch dtype, bits per element)
    "F64": (torch.float64, 64), "F32": (torch.float32, 32), "F16": (torch.float16, 16),
    "BF16": (torch.bfloat16, 16), "I64": (torch.int64, 64), "I32": (torch.int32, 32),
    "I16": (torch.int16, 16), "I8": (torch.int8, 8), "U8": (torch.uint8, 8), "BOOL": (torch.bool, 8),
    "F8_E4M3": (torch.float8_e4m3fn, 8), "F8_E5M2": (torch.float8_e5m2, 8),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    file: Path
    offset: int = 0  # where the tensor's bytes start in `file`
    nbytes: int = 0


def _read_header(path: Path) -> dict:
    """Validate one safetensors file's header without trusting any of it."""
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path.name}: {size} bytes is too short to be a safetensors file (truncated?)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path.name}: header claims {n} bytes, over the {MAX_HEADER_BYTES}-byte cap")
        if 8 + n > size:
            raise CheckpointError(f"{path.name}: header claims {n} bytes but the file has {size}; it is truncated")
        raw = f.read(n)

    def no_duplicates(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise CheckpointError(f"{path.name}: tensor {key!r} appears twice in the header")
            seen[key] = value
        return seen

    try:
        header = json.loads(raw, object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path.name}: the header is not valid JSON ({exc})") from None
    data_len = size - 8 - n
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_code, shape, (start, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path.name}: tensor {name!r} has a malformed header entry") from None
        if dtype_code not in DTYPE_SIZES:
            raise CheckpointError(f"{path.name}: tensor {name!r} has unsupported dtype {dtype_code}")
        nbytes = math.prod(shape) * DTYPE_SIZES[dtype_code][1] // 8
        if not (0 <= start <= end <= data_len) or end - start != nbytes:
            raise CheckpointError(
                f"{path.name}: tensor {name!r} {dtype_code}{shape} needs {nbytes} bytes but its offsets are "
                f"[{start}, {end}) in a {data_len}-byte data section (truncated or corrupt file)")
        spans.append((start, end, name))
    spans.sort()
    cursor = 0
    for start, end, name in spans:
        if start != cursor:
            kind = "overlaps the previous tensor" if start < cursor else "leaves a gap before it"
            raise CheckpointError(f"{path.name}: tensor {name!r} {kind} (offset {start}, expected {cursor})")
        cursor = end
    if cursor != data_len:
        raise CheckpointError(f"{path.name}: {data_len - cursor} trailing bytes after the last tensor")
    return header


def refuse_pickles(directory: Path):
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles and not any(p.suffix == ".safetensors" for p in directory.iterdir()):
        raise UnsafeCheckpointError(
            f"{directory}: only pickle weight files {pickles} are present; they are never unpickled because "
            f"unpickling runs arbitrary code. Convert them to safetensors with a trusted tool first.")


class CheckpointFiles:
    """All tensors of a checkpoint directory (one file or a sharded index), by name, read lazily."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.directory}: not a directory")
        refuse_pickles(self.directory)
        self.infos: dict[str, TensorInfo] = {}
        index = self.directory / INDEX_FILE
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a valid shard index ({exc})") from None
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                if Path(shard).name != shard:
                    raise CheckpointError(f"{index}: shard name {shard!r} must be a plain file name")
                if not (self.directory / shard).exists():
                    raise CheckpointError(f"{index}: shard {shard} is listed but missing from {self.directory}")
            for shard in shards:
                self._add(self.directory / shard)
            listed = set(weight_map)
            for name, info in self.infos.items():
                if weight_map.get(name) != info.file.name:
                    raise CheckpointError(f"{index}: tensor {name!r} is in {info.file.name} but the index says "
                                          f"{weight_map.get(name)}")
            if listed - set(self.infos):
                missing = sorted(listed - set(self.infos))[:5]
                raise CheckpointError(f"{index}: tensors {missing} are listed but absent from their shards")
        elif (self.directory / SINGLE_FILE).exists():
            self._add(self.directory / SINGLE_FILE)
        else:
            found = sorted(p.name for p in self.directory.glob("*.safetensors"))
            if not found:
                raise CheckpointError(f"{self.directory}: no {SINGLE_FILE} or {INDEX_FILE}")
            for p in found:  # a directory of shards without an index
                self._add(self.directory / p)

    def _add(self, path: Path):
        header = _read_header(path)
        with open(path, "rb") as f:
            data_start = 8 + struct.unpack("<Q", f.read(8))[0]
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if name in self.infos:
                raise CheckpointError(f"tensor {name!r} appears in both {self.infos[name].file.name} and {path.name}")
            start, end = meta["data_offsets"]
            self.infos[name] = TensorInfo(name, DTYPE_SIZES[meta["dtype"]][0], tuple(meta["shape"]), path,
                                          data_start + start, end - start)

    def names(self):
        return self.infos.keys()

    def get(self, name: str) -> torch.Tensor:
        return self.load_all([name])[name]

    def load_all(self, names=None, mapped=frozenset(), whole=frozenset()) -> dict[str, torch.Tensor]:
        """The named tensors (default: all), opening each file once: read into process memory, except the
        names in `mapped` (row tables) and `whole` (encoder weights in `release` mode,
        vl/runtime/cpu/encoder_pages.py), which are views of the file's memory map (module docstring)."""
        wanted = set(self.infos) if names is None else set(names)
        out = {}
        by_file: dict[Path, list[str]] = {}
        for name in wanted:
            by_file.setdefault(self.infos[name].file, []).append(name)
        for path, names_in_file in by_file.items():
            if not READ_INTO_MEMORY:
                with safe_open(str(path), framework="pt") as f:
                    out.update((name, f.get_tensor(name)) for name in names_in_file)
                continue
            with open(path, "rb", buffering=0) as f:
                for info in sorted((self.infos[n] for n in names_in_file), key=lambda i: i.offset):
                    if info.name in mapped or info.name in whole:
                        out[info.name] = _map_tensor(f, info, rows=info.name in mapped)
                    else:
                        out[info.name] = _read_tensor(f, info)
        return out


# safetensors stores little-endian bytes; our reads and maps give host-order tensors only on little-endian
# hosts (elsewhere the safetensors library's own path, which converts, is used for every tensor)
READ_INTO_MEMORY = sys.byteorder == "little"


def _map_tensor(f, info: TensorInfo, rows: bool = True) -> torch.Tensor:
    """One tensor as a view of a private (copy-on-write) map of its bytes in the open file `f`. `rows`: a table
    read a few rows at a time (no read-around, cached pages dropped first); else a tensor read whole each time it
    is used, with the kernel's normal read-ahead."""
    if not info.nbytes or info.offset % info.dtype.itemsize:  # a misaligned tensor (legal in the format) is read
        return _read_tensor(f, info)
    start = info.offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    if not rows:
        m = mmap.mmap(f.fileno(), info.offset + info.nbytes - start, access=mmap.ACCESS_COPY, offset=start)
        return torch.frombuffer(m, dtype=torch.uint8, count=info.nbytes,
                                offset=info.offset - start).view(info.dtype).reshape(info.shape)
    if hasattr(os, "posix_fadvise"):
        # cached pages of the range are dropped first: the kernel maps a cached large folio (up to MiBs) whole on
        # a fault, so a prompt's few hundred rows made the whole table resident from a warm cache (1.2 GiB at 12B)
        os.posix_fadvise(f.fileno(), info.offset, info.nbytes, os.POSIX_FADV_DONTNEED)
    m = mmap.mmap(f.fileno(), info.offset + info.nbytes - start, access=mmap.ACCESS_COPY, offset=start)
    if hasattr(mmap, "MADV_RANDOM"):  # no read-around: a row read from disk is a page or two, not megabytes
        m.madvise(mmap.MADV_RANDOM)
    flat = torch.frombuffer(m, dtype=torch.uint8, count=info.nbytes, offset=info.offset - start)  # keeps m alive
    return flat.view(info.dtype).reshape(info.shape)


def _read_tensor(f, info: TensorInfo) -> torch.Tensor:
    """One tensor's bytes read from the open file `f` into a new tensor (anonymous memory)."""
    t = torch.empty(info.shape, dtype=info.dtype)
    if not info.nbytes:
        return t
    # a ctypes view of the tensor's bytes, not `.numpy()`: that marks the storage as not torch's own (not
    # resizable), and the huge-page pass leaves such memory alone (vl/runtime/cpu/hugepages.py)
    buf = memoryview((ctypes.c_char * info.nbytes).from_address(t.data_ptr())).cast("B")
    f.seek(info.offset)
    done = 0
    while done < info.nbytes:  # one read() returns at most ~2 GiB on Linux
        n = f.readinto(buf[done:])
        if not n:
            raise CheckpointError(f"{info.file.name}: tensor {info.name!r} ends past the end of the file "
                                  f"(the file changed or was truncated while loading)")
        done += n
    return t


SCAN_CHUNK = 1 << 24  # elements per isfinite call: its bool temporary stays at 16 MB (a 12B embedding: 671 MB)


def scan_non_finite(tensors: dict[str, torch.Tensor]):
    """Raise naming the first floating tensor that holds NaN or Inf (reliability row C8)."""
    for name, t in tensors.items():
        if not (t.is_floating_point() and t.dtype.itemsize >= 2):
            continue
        flat = t.reshape(-1)
        for i in range(0, flat.numel(), SCAN_CHUNK):
            if not bool(torch.isfinite(flat[i:i + SCAN_CHUNK]).all()):
                raise CheckpointError(f"tensor {name!r} contains NaN or Inf values")


def _sort_header_metadata(path: Path):
    """Rewrite the header's `__metadata__` with its keys sorted, in place, so equal tensors and metadata give
    equal bytes. safetensors serializes that map from a hash map, whose order changes from process to process
    (the tensors themselves are written in a fixed order). The header keeps its length and its padding."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
        header = json.loads(raw)
        meta = header.get("__metadata__")
        if not meta or len(meta) < 2:
            return
        header["__metadata__"] = dict(sorted(meta.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) != len(raw.rstrip(b" ")) or json.loads(text) != json.loads(raw):
            raise CheckpointError(f"{path}: the safetensors header did not re-serialize to the same content and length")
        f.seek(8)
        f.write(text.ljust(n, b" "))


def save_tensors(tensors: dict[str, torch.Tensor], directory: str | os.PathLike,
                 max_shard_bytes: int = 4 * 1024**3, metadata: dict | None = None):
    """Write safetensors, sharded with an index when over `max_shard_bytes`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += nbytes
    shards.append(current)
    meta = {"format": "pt", **(metadata or {})}
    for stale in list(directory.glob("model*.safetensors")) + [directory / INDEX_FILE]:
        if stale.exists():
            stale.unlink()
    if len(shards) == 1:
        save_file(shards[0], str(directory / SINGLE_FILE), metadata=meta)
        _sort_header_metadata(directory / SINGLE_FILE)
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / fname), metadata=meta)
        _sort_header_metadata(directory / fname)
        weight_map.update({name: fname for name in shard})
    total = sum(t.nbytes for t in tensors.values())
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                   indent=2))
