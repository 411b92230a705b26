"""`vllm serve` flags that `vl serve` takes too, so a launch script written for vLLM starts ours as it is.

Two kinds (docs/server.md, "vLLM's flags"):
- the same setting under vLLM's name: `--max-num-seqs` (= `--max-batch`), `--allowed-local-media-path`
  (= `--allowed-root`), `--dtype auto` (the checkpoint's dtype), `--media-io-kwargs` (the video sampling of requests
  that set none: its `fps` and `num_frames`, also the frame cap), and `--video-pruning-rate`,
  `--served-model-name`, `--default-chat-template-kwargs`, which `vl serve` spells as vLLM does;
- settings that cannot change an answer here (`IGNORED`): accepted, and each one given is named at start with why.
vLLM's other spellings: the model as the first positional argument (`vllm serve MODEL`) and flags written with
underscores (`--max_num_seqs`), both taken as vLLM takes them (`vllm_spellings`). Any other vLLM flag is an
unknown flag, a usage error, as a misspelt one is. Torch-free: `vl serve --help` stays quick.
"""

from __future__ import annotations

import argparse
import json

from vl.options import spec

# flag -> (takes a value, why it changes nothing here)
IGNORED = {
    "--trust-remote-code": (False, "no checkpoint code ever runs here: the architecture is this package's"),
    "--tensor-parallel-size": (True, "one device serves the whole model"),
    "--pipeline-parallel-size": (True, "one device serves the whole model"),
    "--gpu-memory-utilization": (True, "no KV-cache pool is reserved up front: each request's cache is its own"),
    "--max-model-len": (True, "prompts are checked against the model's own context length"),
    "--enable-prefix-caching": (False, "no prefix cache: each prompt is prefilled"),
    "--no-enable-prefix-caching": (False, "no prefix cache: each prompt is prefilled"),
    "--disable-mm-preprocessor-cache": (False, "media are decoded per request (an encoder cache keeps repeats)"),
    "--enforce-eager": (False, "a scheduling choice: the same answers either way"),
    "--max-num-batched-tokens": (True, "a joining prompt's chunk per step is --mix-chunk"),
    "--enable-chunked-prefill": (False, "a joining prompt is prefilled in chunks beside running rows (--mix-chunk)"),
    "--no-enable-chunked-prefill": (False, "a joining prompt's chunking is --mix-chunk's (0: at once)"),
    "--kv-cache-dtype": (True, "the cache keeps the model's dtype (auto); another dtype is refused"),
    "--reasoning-parser": (True, "the reasoning always comes back apart, in reasoning_content"),
    "--quantization": (True, "the checkpoint's own quantization config decides how its weights load (ModelOpt "
                             "FP8 / NVFP4 checkpoints)"),
    "--disable-log-requests": (False, "request logging is --log-level's"),
    "--enable-log-requests": (False, "request logging is --log-level's"),
    "--no-enable-log-requests": (False, "request logging is --log-level's"),
    "--disable-log-stats": (False, "request logging is --log-level's"),
    "--data-parallel-size": (True, "one process serves the whole model"),
    "--async-scheduling": (False, "a scheduling choice: the same answers either way"),
    "--enable-auto-tool-choice": (False, "no tool calling here: a request with tools is refused (400)"),
    "--tool-call-parser": (True, "no tool calling here: a request with tools is refused (400)"),
    "--reasoning-parser-plugin": (True, "no plugin file is ever run: the reasoning always comes back apart"),
    "--mamba-ssm-cache-dtype": (True, "the Mamba state is kept in the checkpoint's mamba_ssm_cache_dtype (float32 "
                                      "in the released configs); another dtype is refused"),
}


def media_io(text: str) -> tuple[float | None, int | None]:
    """vLLM's `--media-io-kwargs '{"video": {"fps": 2, "num_frames": 128}}'` -> (fps, num_frames): the server's
    video sampling when a request sets none, num_frames also its cap on frames (vLLM's meaning). Anything else in
    the object would change how media decode in ways this server does not implement: ValueError."""
    value = json.loads(text)
    video = value.get("video") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) - {"video"} or not isinstance(video, dict) or \
            set(video) - {"fps", "num_frames"}:
        raise ValueError("only {\"video\": {\"fps\": F, \"num_frames\": N}} is taken here (the server's video "
                         f"sampling); found {text[:120]}")
    fps, frames = video.get("fps"), video.get("num_frames")
    return (None if fps is None else spec("fps").check(fps, "--media-io-kwargs video.fps"),
            None if frames is None else spec("max_frames").check(frames, "--media-io-kwargs video.num_frames"))


def _dest(flag: str) -> str:
    return "vllm_" + flag.lstrip("-").replace("-", "_")


def vllm_spellings(argv: list[str], p: argparse.ArgumentParser) -> list[str]:
    """`argv` with vLLM's underscore spellings of flags (`--max_num_seqs 4`, `--mamba_ssm_cache_dtype=float32`)
    turned into the dashed names `p` knows, as vLLM's own parser does; anything else is left as it is."""
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        dashed = "--" + name[2:].replace("_", "-")
        if arg.startswith("--") and "_" in name and dashed in p._option_string_actions:
            arg = dashed + eq + value
        out.append(arg)
    return out


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM's spellings (docs/server.md, \"vLLM's flags\")")
    g.add_argument("--max-num-seqs", dest="max_batch", type=int, metavar="N", help="= --max-batch")
    g.add_argument("--allowed-local-media-path", dest="allowed_root", action="append", metavar="DIR",
                   help="= --allowed-root")
    g.add_argument("--media-io-kwargs", default=None, metavar="JSON", help='\'{"video": {"fps": F, "num_frames": '
                   'N}}\': the video sampling of requests that set none (default 2 fps, 128 frames), N also the cap')
    for flag, (value, why) in IGNORED.items():
        if value:
            g.add_argument(flag, dest=_dest(flag), default=None, metavar="V", help=f"accepted; {why}")
        else:
            g.add_argument(flag, dest=_dest(flag), action="store_true", default=None, help=f"accepted; {why}")


# --quantization values that name a checkpoint's own stored format (what vLLM reads from a ModelOpt directory); the
# others quantize a 16-bit checkpoint as it loads, which would change the answers: refused, `vl quantize` writes one
STORED_FORMATS = ("modelopt", "modelopt_fp4", "modelopt_mixed")


def check_vllm_flags(args: argparse.Namespace) -> str | None:
    """What is wrong with the vLLM flags given, or None."""
    cache = getattr(args, _dest("--kv-cache-dtype"), None)
    if cache is not None and cache != "auto":
        return (f"--kv-cache-dtype {cache}: a cache stored in another dtype than the model's changes the answers; "
                "this server keeps the model's (auto)")
    state = getattr(args, _dest("--mamba-ssm-cache-dtype"), None)
    if state is not None and state not in ("auto", "float32"):
        return (f"--mamba-ssm-cache-dtype {state}: a Mamba state stored in 16 bits changes the answers; this server "
                "keeps the checkpoint's (float32 in the released configs)")
    method = getattr(args, _dest("--quantization"), None)
    if method is not None and method not in STORED_FORMATS:
        return (f"--quantization {method}: vLLM would quantize the weights as they load, which changes the answers; "
                f"here a checkpoint carries its own format ({', '.join(STORED_FORMATS)} are taken as that): write "
                "one with `vl quantize` and serve it")
    return None


def ignored_notes(args: argparse.Namespace) -> list[str]:
    """One line per vLLM flag given that changes nothing here, for the start-up log."""
    out = []
    for flag, (value, why) in IGNORED.items():
        given = getattr(args, _dest(flag), None)
        if given is not None:
            out.append(f"vLLM's {flag}{' ' + str(given) if value else ''} accepted and not used: {why}")
    return out
