"""The mechanism shared by every checkpoint adapter (torchtitan `state_dict_adapter.py` in spirit).

An adapter turns checkpoint tensor names into a *plan*: for each native parameter name, which checkpoint
tensors feed it (one, or several stacked, e.g. per-expert weights into a fused tensor), plus the names it
deliberately ignores and why. The plan is checked against the model's expected names, shapes and dtypes
from the headers alone, before a single tensor is read; then tensors are read once and assigned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vl.checkpoint.files import CheckpointFiles
from vl.errors import CheckpointError

# Checkpoint storage dtypes a floating parameter may come in; the loader then casts to the compute dtype.
FLOAT_STORAGE = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Plan:
    sources: dict[str, list[str]] = field(default_factory=dict)  # native name -> checkpoint names
    stacked: set[str] = field(default_factory=set)  # native names built by stacking their sources
    ignored: dict[str, str] = field(default_factory=dict)  # checkpoint name -> reason

    def add(self, native: str, source: str, stack: bool = False):
        self.sources.setdefault(native, []).append(source)
        if stack:
            self.stacked.add(native)

    def shape(self, native: str, files: CheckpointFiles) -> tuple[int, ...]:
        infos = [files.infos[s] for s in self.sources[native]]
        if native in self.stacked:
            shapes = {i.shape for i in infos}
            if len(shapes) != 1:
                raise CheckpointError(f"{native}: stacked source tensors disagree in shape: {sorted(shapes)}")
            return (len(infos), *infos[0].shape)
        return infos[0].shape


def expected_tensors(model: nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Names, shapes and dtypes the model wants (parameters and persistent buffers)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict(keep_vars=True).items()}


def check_plan(plan: Plan, files: CheckpointFiles, expected: dict, storage_dtype: torch.dtype | None,
               quantized: set[str] = frozenset(), what: str = "checkpoint"):
    """Strict: every expected tensor present with the right shape and a sane dtype, nothing unexpected.

    `quantized` lists native names whose tensors are checked by the quantization loader instead.
    `storage_dtype` is the dtype the config declares (e.g. bfloat16); floating tensors must be in it or in
    float32 (kept precision), anything else (F16 where BF16 is declared, integers) is an error. An expected
    dtype outside those (the packed uint8 / float8 tensors of a quantized Linear) must match exactly.
    """
    problems = []
    for native in sorted(set(expected) - set(plan.sources) - quantized):
        problems.append(f"missing tensor {native!r} (shape {list(expected[native][0])})")
    for native in sorted(set(plan.sources) - set(expected) - quantized):
        problems.append(f"unexpected tensor(s) {plan.sources[native][:3]} (no such parameter {native!r})")
    for native in sorted(set(plan.sources) & set(expected)):
        if native in quantized:
            continue
        want_shape, want_dtype = expected[native]
        got = plan.shape(native, files)
        if got != want_shape:
            problems.append(f"tensor {plan.sources[native][0]!r}: expected shape {list(want_shape)}, found {list(got)}")
            continue
        for src in plan.sources[native]:
            dt = files.infos[src].dtype
            if want_dtype not in FLOAT_STORAGE:  # packed FP8 / NVFP4 tensors (vl.checkpoint.quantized): exact
                if dt != want_dtype:
                    problems.append(f"tensor {src!r}: expected {want_dtype}, found {dt}")
            elif not dt.is_floating_point or dt not in FLOAT_STORAGE:
                problems.append(f"tensor {src!r}: expected a floating dtype, found {dt}")
            elif storage_dtype is not None and dt not in (storage_dtype, torch.float32):
                problems.append(f"tensor {src!r}: expected {storage_dtype} (declared by the config) or float32, "
                                f"found {dt}")
    if problems:
        head = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise CheckpointError(f"{what} at {files.directory} does not match the model:\n  {head}{more}")


def row_tables(model: nn.Module) -> set[str]:
    """Native names of the model's embedding tables that nothing else uses (a tied LM head reads the whole
    table every token): a forward reads only the rows of its token ids, so the loader leaves them mapped."""
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    return {f"{name}.weight" if name else "weight" for name, m in model.named_modules()
            if isinstance(m, nn.Embedding) and uses.get(id(m.weight)) == 1}


def materialize(plan: Plan, files: CheckpointFiles, names=None, mapped=frozenset(),
                whole=frozenset()) -> dict[str, torch.Tensor]:
    """Read the planned tensors (each checkpoint tensor once) into native names; the natives in `mapped` (row
    tables) and `whole` (encoder weights) stay views of the file's memory map (vl/checkpoint/files.py)."""
    names = plan.sources.keys() if names is None else names
    wanted = [s for n in names for s in plan.sources[n]]

    def sources(natives):
        return {s for n in natives if n in plan.sources and n not in plan.stacked for s in plan.sources[n]}

    raw = files.load_all(wanted, mapped=sources(mapped), whole=sources(whole))
    out = {}
    for native in names:
        srcs = plan.sources[native]
        out[native] = torch.stack([raw.pop(s) for s in srcs]) if native in plan.stacked else raw.pop(srcs[0])
    return out
