"""A checkpoint directory's small files, read before any weight: where it is, its config.json and
preprocessor_config.json, and which kind of checkpoint it is (read from config.json fields, never from names).

These sit below the model code so that the processor, the loader, eval fingerprints and the server read a
directory the same way without importing the loader (docs/architecture.md, layers).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from vl.errors import CheckpointError, ConfigError, UnsafeCheckpointError

log = logging.getLogger("vl.checkpoint.load")


def default_model() -> str:
    """The shipped demo checkpoint (package data: vl/demo), which commands use when no --model is given."""
    return str(Path(__file__).parent / "demo")


# config.json key that marks a checkpoint trained only on the synthetic documents and clips of data_recipes/ (the
# shipped demo model): `vl chat` and the app warn whenever such a model serves. It is a key of the checkpoint, not
# its folder, so copies keep it (`vl quantize` writes the input's config.json keys into the copy's); `_`-prefixed,
# it is bookkeeping to every loader: accepted and named, never read as maths (vl/config_policy.py).
SYNTHETIC_ONLY_KEY = "_vl_synthetic_only"


def synthetic_only(path) -> bool:
    """True when the checkpoint at `path` is marked as reading only synthetic inputs (`SYNTHETIC_ONLY_KEY`);
    False for any other checkpoint and for a path that is not one (its loader says why)."""
    try:
        directory = resolve_dir(path)
        return read_config(directory).get(SYNTHETIC_ONLY_KEY) is True
    except CheckpointError:
        return False


def resolve_dir(path) -> Path:
    """A local directory, or a hub id that huggingface_hub already has in its cache (never downloads)."""
    p = Path(os.fspath(path)).expanduser()
    if p.is_dir():
        return p
    if isinstance(path, str) and path.count("/") == 1 and not p.exists():
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(path, local_files_only=True))
        except Exception:  # noqa: BLE001 - any failure means "not cached"
            pass
        raise CheckpointError(fetch_instructions(path))
    raise CheckpointError(f"{path}: not a checkpoint directory (and not a hub id already in the local cache); "
                          f"hub downloads are not attempted")


def fetch_instructions(repo_id: str) -> str:
    """What to do when a hub id is not in the local cache: the exact commands to fetch it (docs/checkpoints.md)."""
    local = "./" + repo_id.split("/")[1]
    return (f"{repo_id}: not a local directory, and not in the local Hugging Face cache; nothing is downloaded "
            f"here. On a machine with internet, fetch it with\n"
            f"    hf download {repo_id} --local-dir {local}\n"
            f"or in Python\n"
            f"    from huggingface_hub import snapshot_download\n"
            f"    snapshot_download({repo_id!r}, local_dir={local!r})\n"
            f"then copy that folder here and pass it as the model: --model {local} (or vl.Engine.from_pretrained"
            f"({local!r})). Supported checkpoints and the memory they need: docs/checkpoints.md")


def read_config(directory: Path) -> dict:
    f = Path(directory) / "config.json"
    if not f.exists():
        raise CheckpointError(f"{directory}: no config.json" + _folder_hint(Path(directory)))
    return _json_object(f)


def _folder_hint(directory: Path) -> str:
    """For a folder of checkpoints passed where one checkpoint is expected: which sub-folders are checkpoints."""
    try:
        subs = [sub.name for sub, _ in _sub_checkpoints(directory)[0]]
    except OSError:
        return ""
    if not subs:
        return ""
    return (f"; it is a folder of checkpoints ({', '.join(subs[:8])}{', ...' if len(subs) > 8 else ''}): pass one "
            f"of them, e.g. --model {directory / subs[0]} (`vl app --model {directory}` offers them all in a picker)")


def _json_object(f: Path) -> dict:
    try:
        value = json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{f}: invalid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{f}: expected a JSON object")
    return value


# The names config.json carries for each kind: transformers' own, and those the released directories' remote code
# writes (Nemotron 3 Nano Omni's hub directories say `NemotronH_Nano_Omni_Reasoning_V3` for both model_type and
# architecture, the class names of their configuration.py / modeling.py, as vLLM and SGLang register them;
# transformers' native classes say `nemotron_h_omni` / `NemotronH_Omni_Reasoning_V3`). Read as the same layout.
NANO_VL_V2_CLASS = "NemotronH_Nano_VL_V2"
OMNI_HUB_CLASS = "NemotronH_Nano_Omni_Reasoning_V3"
KIND_NAMES = {
    "nemotron_h": (("nemotron_h",), ("NemotronHForCausalLM",)),
    "nano_vl_v2": ((NANO_VL_V2_CLASS,), (NANO_VL_V2_CLASS,)),
    "nemotron_h_omni": (("nemotron_h_omni", OMNI_HUB_CLASS), ("NemotronH_Omni_Reasoning_V3", OMNI_HUB_CLASS)),
}


def checkpoint_kind(raw: dict, directory: Path) -> str:
    model_type = raw.get("model_type")
    archs = raw.get("architectures") or []
    kind = next((k for k, (types, classes) in KIND_NAMES.items()
                 if model_type in types or any(a in classes for a in archs)), None)
    if kind is None:
        if raw.get("auto_map"):
            raise UnsafeCheckpointError(
                f"{directory}: model_type={model_type!r} / architectures={archs} is not a supported architecture and "
                f"would need its remote code (auto_map {raw['auto_map']}); remote code is never executed")
        raise ConfigError(f"{directory}: unsupported model_type={model_type!r} (architectures {archs}); supported: "
                          f"{', '.join(t for types, _ in KIND_NAMES.values() for t in types)}")
    if raw.get("auto_map"):
        log.info("%s: ignoring auto_map (remote code is never executed); loading %s natively", directory, kind)
    return kind


def read_preprocessor(directory: Path) -> dict | None:
    """preprocessor_config.json as a dict, or None when the directory has none."""
    pre = Path(directory) / "preprocessor_config.json"
    return _json_object(pre) if pre.exists() else None


def checkpoint_choices(path) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """What `vl app --model PATH` can serve: ([(checkpoint dir, kind)], [(skipped dir, why)]).

    PATH itself when it holds a config.json (a checkpoint, or a hub id already in the local cache); otherwise
    each sub-folder of PATH that holds one (a folder of checkpoints), in name order. A sub-folder whose
    config.json names no supported architecture is skipped, with the reason, so that one stray folder does
    not stop the others from being offered; the kind comes from config.json fields (`checkpoint_kind`).
    """
    root = resolve_dir(path)
    if (root / "config.json").is_file():
        return [(root, checkpoint_kind(read_config(root), root))], []
    found, skipped = _sub_checkpoints(root)
    if not found:
        raise CheckpointError(f"{root}: no config.json here, and no sub-folder with a supported checkpoint's "
                              f"config.json (a folder of checkpoints); pass a checkpoint directory"
                              + (f" (skipped: {'; '.join(why for _, why in skipped)})" if skipped else ""))
    return found, skipped


def _sub_checkpoints(root: Path) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """The sub-folders of `root` holding a config.json, in name order: ([(dir, kind)], [(dir, why it is skipped)])."""
    found, skipped = [], []
    for sub in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name):
        if not (sub / "config.json").is_file():
            continue
        try:
            found.append((sub, checkpoint_kind(read_config(sub), sub)))
        except (CheckpointError, ConfigError, UnsafeCheckpointError) as exc:
            skipped.append((sub, str(exc)))
    return found, skipped
