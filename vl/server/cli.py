"""`vl serve`: load a checkpoint, start the scheduler, serve the OpenAI-compatible API with uvicorn.

Flags follow vLLM's spellings where one exists (`--host`, `--port`, `--api-key`, `--served-model-name`,
`--default-chat-template-kwargs`), and `vl app`'s for the model (`--model`, `--dtype`, `--device-map`,
`--video-pruning-rate`); vLLM's own names for the same settings and its flags that change nothing here are taken
too (vl/server/vllm_flags.py), so a vLLM launch line starts this server. docs/server.md has the security policy
behind the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from vl.directory import default_model
from vl.errors import VLError
from vl.kernels import switches
from vl.server.ceilings import Ceilings, ConnectionLimits
from vl.server.media import MediaPolicy
from vl.server.template_defaults import TemplateDefaults
from vl.server.vllm_flags import add_vllm_flags, check_vllm_flags, ignored_notes, media_io, vllm_spellings


def parse_args(argv: list[str]) -> argparse.Namespace:
    c = Ceilings()
    p = argparse.ArgumentParser(prog="vl serve", description="OpenAI-compatible server: GET /v1/models, "
                                "POST /v1/chat/completions, GET /health (docs/server.md)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model, vl/demo)")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="the same as --model, where vLLM "
                   "takes it (`vl serve DIR`)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                   "anything else should sit behind a proxy and use --api-key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=switches.get("VL_API_KEY"), help="require Authorization: Bearer KEY on "
                   "/v1/* (default: $VL_API_KEY; none = open)")
    p.add_argument("--served-model-name", default=None, help="model id clients send (default: the model "
                   "folder's name)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait; one more gets 429 (default 64)")
    p.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default 8)")
    p.add_argument("--batch-window-ms", type=float, default=0.0, help="how long the idle server waits for "
                   "requests sent together before it starts a batch (default 0: requests that arrive while a batch "
                   "runs join it between steps anyway; docs/server.md)")
    p.add_argument("--mix-chunk", type=int, default=None, metavar="N", help="tokens of a prompt that joins running "
                   "requests prefilled per decode step, so they keep streaming (0: the whole prompt at once). Default: "
                   "on the CPU a prompt over 64 tokens rides inside the decode steps, as many tokens per step as keep "
                   "each step within 60%% more than the running rows' own (docs/server.md); on CUDA 512")
    p.add_argument("--prepare-workers", type=int, default=1, help="threads that decode and tile waiting requests' "
                   "media while the engine decodes (default 1; 0: on the engine's thread)")
    p.add_argument("--request-timeout", type=float, default=c.request_timeout_s, help="seconds from arrival to "
                   f"the last token; past it: 504 (default {c.request_timeout_s:g})")
    p.add_argument("--max-tokens-limit", type=int, default=c.max_tokens, help="ceiling on max_tokens per request "
                   f"(default {c.max_tokens})")
    p.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request gives none")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="request body cap in MiB; over it: 413")
    e = ConnectionLimits()
    p.add_argument("--header-timeout", type=float, default=e.header_timeout_s, help="seconds a request head may take "
                   f"from its first byte; then the connection is closed (default {e.header_timeout_s:g})")
    p.add_argument("--body-timeout", type=float, default=e.body_timeout_s, help="seconds a request body may take "
                   f"after its head; then 408 (default {e.body_timeout_s:g})")
    p.add_argument("--keep-alive-timeout", type=float, default=e.keep_alive_s, help="seconds an idle keep-alive "
                   f"connection stays open (default {e.keep_alive_s:g})")
    p.add_argument("--max-connections", type=int, default=e.max_connections, help="open connections; a request on "
                   f"one more is answered 503 (default {e.max_connections})")
    p.add_argument("--allowed-root", action="append", default=[], help="folder file:// media may come from "
                   "(repeatable; default: none, file:// refused)")
    p.add_argument("--allow-fetch", action="store_true", help="fetch http(s) media URLs (public addresses only, "
                   "no redirects, capped in bytes and time)")
    p.add_argument("--allow-private-fetch", action="store_true", help="with --allow-fetch: also from loopback and "
                   "private addresses (trusted networks only)")
    p.add_argument("--fetch-timeout", type=float, default=10.0, help="seconds per fetched URL (default 10)")
    p.add_argument("--fetch-max-mb", type=float, default=None, help="bytes per fetched URL in MiB (default: the "
                   "media kind's upload cap)")
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: the checkpoint's)")
    p.add_argument("--device-map", default=None, help='accelerate device map, e.g. "auto" (default: CPU, or the '
                   "first GPU)")
    p.add_argument("--video-pruning-rate", type=float, default=None, help="EVS rate in [0, 1) when a request "
                   "gives none (default: the checkpoint's)")
    p.add_argument("--default-chat-template-kwargs", default=None, metavar="JSON", help="vLLM's flag: chat "
                   "template variables for every request, under each request's own chat_template_kwargs; its "
                   "enable_thinking is the reasoning mode of a request that sets none (default: off), e.g. "
                   "'{\"enable_thinking\": true, \"truncate_history_thinking\": false}' (docs/server.md)")
    p.add_argument("--decode-sandbox", choices=["on", "off"], default="on", help="decode media in killable "
                   "subprocesses (default on)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's, one per core); "
                   "on a CPU shared with other work, 1 avoids threads waiting on each other (docs/server.md)")
    p.add_argument("--log-level", default="info")
    add_vllm_flags(p)
    args = p.parse_args(vllm_spellings(list(argv), p))
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            p.error(f"two models given: {args.model_tag} and --model {args.model}; give one")
        args.model = args.model_tag
    if args.dtype == "auto":  # vLLM's spelling of the checkpoint's own dtype
        args.dtype = None
    if (problem := check_vllm_flags(args)) is not None:
        p.error(problem)
    try:
        args.video_fps, args.video_frames = (None, None) if args.media_io_kwargs is None else media_io(
            args.media_io_kwargs)
    except (ValueError, VLError) as e:
        p.error(f"--media-io-kwargs: {e}")
    try:  # checked before any model loads
        args.template_defaults = (None if args.default_chat_template_kwargs is None else
                                  TemplateDefaults.from_json(args.default_chat_template_kwargs))
    except VLError as e:
        p.error(str(e))
    if args.mix_chunk is not None and args.mix_chunk < 0:
        p.error(f"--mix-chunk must be >= 0 (0: a joining prompt is prefilled at once), found {args.mix_chunk}")
    return args


def build(args: argparse.Namespace):
    """-> (engine, scheduler, ServerConfig, app); loads the model (a broken checkpoint is never served)."""
    from vl.runtime.engine import Engine
    from vl.server.app import ServerConfig, create_app
    from vl.server.scheduler import Scheduler

    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    model = args.model or default_model()
    roots = [str(Path(r).resolve()) for r in args.allowed_root]
    # a server decodes batches, and a joining prompt rides in them as extra rows: there the ReLU^2 down_proj as
    # stored (one tile pass for all rows) beats the layout by input rows (fp32 multiply-adds per row), which one
    # row decoding alone prefers; VL_SPARSE_DOWN=on still asks for it (docs/server.md, "Batching")
    with switches.command_default("VL_SPARSE_DOWN", "off"):
        engine = Engine.from_pretrained(model, dtype=args.dtype, device_map=args.device_map,
                                        video_pruning_rate=args.video_pruning_rate,
                                        isolate=args.decode_sandbox == "on", allowed_roots=roots or None)
    engine.mix_chunk = args.mix_chunk
    mib = 1 << 20
    policy = MediaPolicy(limits=engine.processor.limits, allowed_roots=tuple(roots), allow_fetch=args.allow_fetch,
                         allow_private_fetch=args.allow_private_fetch, fetch_timeout_s=args.fetch_timeout,
                         fetch_max_bytes=None if args.fetch_max_mb is None else int(args.fetch_max_mb * mib))
    ceilings = Ceilings(max_tokens=args.max_tokens_limit, request_timeout_s=args.request_timeout,
                        **({} if args.video_frames is None else {"max_frames": args.video_frames}))
    cfg = engine.model.config
    info = {"vl": {"max_num_tiles": getattr(cfg, "max_num_tiles", None),
                   "video_pruning_rate": getattr(cfg, "video_pruning_rate", None),
                   "tokens_per_tile": getattr(cfg, "tokens_per_tile", None)}}  # has_vision, has_audio: app.model_facts
    config = ServerConfig(served_names=(args.served_model_name or Path(model).resolve().name,),
                          api_key=args.api_key or None, max_body_bytes=int(args.max_body_mb * mib),
                          default_max_tokens=args.default_max_tokens, policy=policy, ceilings=ceilings,
                          model_info=info, connection=connection_limits(args),
                          template_defaults=args.template_defaults, default_fps=args.video_fps)
    scheduler = Scheduler(engine, max_batch=args.max_batch, max_queue=args.max_queue,
                          batch_window_s=args.batch_window_ms / 1000, prepare_workers=args.prepare_workers)
    return engine, scheduler, config, create_app(engine, scheduler, config)


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    return ConnectionLimits(header_timeout_s=args.header_timeout, keep_alive_s=args.keep_alive_timeout,
                            max_connections=args.max_connections, body_timeout_s=args.body_timeout)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if (args.max_batch < 1 or args.max_queue < 0 or args.request_timeout <= 0 or args.max_tokens_limit < 1
            or args.prepare_workers < 0 or min(args.header_timeout, args.body_timeout, args.keep_alive_timeout) <= 0
            or args.max_connections < 1):
        print("vl serve: --max-batch must be >= 1, --max-queue >= 0, --request-timeout > 0, --max-tokens-limit >= 1, "
              "--prepare-workers >= 0, the timeouts > 0 and --max-connections >= 1", file=sys.stderr)
        return 2
    import uvicorn

    from vl.server.edge import uvicorn_kwargs


    try:
        _, scheduler, config, app = build(args)
    except (VLError, OSError) as exc:  # never serve a half-loaded model
        print(f"vl serve: could not load the model: {exc}", file=sys.stderr)
        return 2
    name = config.served_names[0]
    for note in ignored_notes(args):
        print(f"vl serve: {note}", file=sys.stderr)
    print(f"vl serve: model {name!r} on http://{args.host}:{args.port}/v1 (Ctrl-C stops)", file=sys.stderr,
          flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=5,
                    **uvicorn_kwargs(connection_limits(args), args.log_level))
    finally:
        scheduler.close()
    return 0
