"""`vl serve` throughput: 8 concurrent clients against one client at a time, on the demo model or a memory-bound LM.

Starts `vl serve` on a free loopback port (the shipped demo model unless --model), then sends the same
document questions (held-out synthetic pages and PDFs, greedy, reasoning --thinking on|off) in two phases,
interleaved over --rounds rounds so that a busy machine affects both alike:
  * sequential: one client, one request after the other;
  * concurrent: --clients client threads at once, each with its share of the requests (the server batches
    what arrives together, vl/server/scheduler.py).
Two workloads (--workload):
  * docs (default): each answer as long as the model makes it, at most --max-tokens (default 64; the demo
    model answers in ~17 tokens), so per-request work (HTTP, JSON, base64, media decoding, tiling, prefill)
    dominates and batching shares little;
  * long: the same questions with vLLM's `ignore_eos: true` and --max-tokens (default 128), so every answer is
    exactly that long and decoding dominates: the regime in which batching decode steps is what makes a server
    fast (vLLM's serving benchmark has an --ignore-eos flag for the same purpose).
  * text: --prompt-tokens-long text prompts (no media) with `ignore_eos` and --max-tokens (default 128), for a
    language model whose decode streams its weights from memory: --build 180m writes the 180m bench config
    (bf16, random weights) and --build nano-12b-v2-vl --layers N the 12B widths' first N layers (FP8 / NVFP4,
    vl/bench/geometry.py's writer), each with the demo model's tokenizer padded to the model's vocabulary so that
    every generated id streams as text.
With --join-tokens N (text workload) a third phase measures what a long prompt joining costs the running rows:
--clients - 1 streaming clients decode; their inter-token gaps are recorded for a while, then a request with an
N-token prompt is sent, and the gaps until its first token are recorded (p50 / p95 of both, and their ratio).
--mix-chunk sets the tokens of a joining prompt prefilled per decode step (vl/runtime/decode_batch.py; 0: all at
once, the old behaviour).
Reports requests/s and completion tokens/s of each phase, their ratio (overall and per round, with the
median), p50/p95 request latency, and the CPU time the server (its threads and its media-decoding sandbox
workers) and the client used per request: on a machine shared with other work the CPU per request is the
steadier figure. The server joins requests that arrive while a batch decodes into it (continuous batching),
and /health counts them.

Fairness: both phases send the same questions; the warm-up sends every question once, so both start from the
same state of the server's vision cache (with the default 64 questions, more media than that cache holds, so
tiles are encoded as for new requests in both phases); the server runs with --threads 1 (default), and the
client's own CPU use is reported so that it can be seen not to starve the server.

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_server.py [--workload docs|long|text] [--requests 64] [--clients 8]
       [--rounds 2] [--max-tokens N] [--max-batch 8] [--batch-window-ms MS] [--prepare-workers N] [--json out.json]
       [--build 180m|nano-12b-v2-vl [--layers N] [--format nvfp4|fp8]] [--prompt-tokens 128] [--join-tokens 4096]
       [--mix-chunk N]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def questions(n: int, tile: int) -> list[dict]:
    from data_recipes.synthetic.export import export_split

    data = export_split("document", "test", n, Path(tempfile.mkdtemp(prefix="vl-bench-server-")), tile_size=tile)
    out = []
    for line in data.read_text().splitlines():
        row = json.loads(line)
        part = row["content"][0]
        b64 = base64.b64encode((data.parent / part[part["type"]]).read_bytes()).decode()
        media = ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}} if part["type"] == "image"
                 else {"type": "file", "file": {"filename": "page.pdf", "file_data": "data:application/pdf;base64," + b64}})
        out.append({"media": media, "question": row["question"]})
    return out


WORKLOADS = {"docs": (64, {}), "long": (128, {"ignore_eos": True}), "text": (128, {"ignore_eos": True})}
# default --max-tokens, extra body fields
WORDS = ("total", "red", "circle", "moves", "right", "field", "top", "name", "stars", "video", "frame", "answer",
         "left", "up", "down", "green", "blue", "yellow", "image", "describe")


def build_lm(kind: str, out: Path, layers: int | None, fmt: str) -> Path:
    """A text-only `nemotron_h` directory with random weights: the 180m bench config in bf16, or a released
    geometry's first `layers` layers in FP8 / NVFP4; the demo tokenizer padded with added tokens to the vocab."""
    import torch
    import transformers

    from vl.bench.geometry import geometry_config, write_random_checkpoint
    from vl.checkpoint.files import save_tensors
    from vl.checkpoint.nemotron_h import export_lm
    from vl.config import bench_180m_lm, lm_config_to_hf
    from vl.modeling.nemotron_h import NemotronHForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(REPO / "vl" / "demo"))
    eos = tok.convert_tokens_to_ids("<SPECIAL_12>")
    if kind == "180m":
        cfg = bench_180m_lm(eos_token_id=(eos,))
        torch.manual_seed(0)
        lm = NemotronHForCausalLM(cfg).eval()
        with torch.no_grad():
            for w in lm.parameters():
                if w.dim() > 1:
                    w.normal_(0, 0.02)
        save_tensors(export_lm(lm.to(torch.bfloat16).state_dict()), out)
        cfg_json = lm_config_to_hf(cfg)
        cfg_json.update(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], torch_dtype="bfloat16")
        (out / "config.json").write_text(json.dumps(cfg_json, indent=2))
    else:
        import dataclasses

        cfg = dataclasses.replace(geometry_config(kind, layers), eos_token_id=(eos,))
        write_random_checkpoint(cfg, fmt, out)
    tok.add_tokens([f" w{i}" for i in range(cfg.vocab_size - len(tok))])
    tok.save_pretrained(out)
    return out


def text_questions(n: int, tokens: int, model: str, seed: int = 0) -> list[dict]:
    """n text prompts of about `tokens` tokens each (random words, counted with the model's tokenizer)."""
    import random

    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model)
    rng, out = random.Random(seed), []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(tokens)]
        while len(tok(" ".join(words))["input_ids"]) > tokens:
            words.pop()
        out.append({"media": None, "question": " ".join(words)})
    return out


def ask(client: httpx.Client, base: str, q: dict, max_tokens: int, thinking: bool,
        extra: dict | None = None) -> tuple[float, int]:
    parts = ([q["media"]] if q["media"] else []) + [{"type": "text", "text": q["question"]}]
    body = {"messages": [{"role": "user", "content": parts}],
            "max_tokens": max_tokens, "temperature": 0, "chat_template_kwargs": {"enable_thinking": thinking},
            **(extra or {})}
    t0 = time.perf_counter()
    r = client.post(base + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["usage"]["completion_tokens"]


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used, its threads and the sandbox workers it waited for
    included (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def children_cpu_s(pid: int) -> float:
    """CPU seconds of a process's live children (the server's media decode sandbox workers)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += cpu_s(int(child))
            except OSError:
                pass
    return total


def phase(base: str, qs: list[dict], clients: int, max_tokens: int, thinking: bool, server_pid: int,
          extra: dict | None = None) -> dict:
    lat, toks, lock = [], [], threading.Lock()
    shares = [qs[i::clients] for i in range(clients)]

    def run(share):
        with httpx.Client() as c:
            for q in share:
                s, n = ask(c, base, q, max_tokens, thinking, extra)
                with lock:
                    lat.append(s)
                    toks.append(n)

    server0, client0 = cpu_s(server_pid) + children_cpu_s(server_pid), time.process_time()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(s,)) for s in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": len(lat), "wall_s": wall, "latencies_s": lat, "tokens": sum(toks),
            "server_cpu_s": cpu_s(server_pid) + children_cpu_s(server_pid) - server0,
            "client_cpu_s": time.process_time() - client0}


def join_phase(base: str, qs: list[dict], clients: int, join_q: dict, thinking: bool, warm_tokens: int = 16,
               base_tokens: int = 32) -> dict:
    """`clients` streaming rows decode; their inter-token gaps are recorded for `base_tokens` tokens each (the
    usual), then `join_q` is sent and the gaps are recorded until its first token (while it joins)."""
    import queue

    marks: queue.Queue = queue.Queue()  # (client, time) per streamed chunk
    stop = threading.Event()

    def stream(i):
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": qs[i]["question"]}]}],
                "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": True,
                "chat_template_kwargs": {"enable_thinking": thinking}}
        with httpx.Client(timeout=600) as c, c.stream("POST", base + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("data: {") and '"delta"' in line:
                    marks.put((i, time.perf_counter()))

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    last, counts, gaps = {}, {}, {"usual": [], "join": []}
    phase_of, joined = "warm", threading.Event()
    ttft = {}

    def joiner():
        t0 = time.perf_counter()
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": join_q["question"]}]}],
                "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
                "chat_template_kwargs": {"enable_thinking": thinking}}
        with httpx.Client(timeout=600) as c, c.stream("POST", base + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"delta"' in line and "ttft" not in ttft:
                    ttft["ttft"] = time.perf_counter() - t0
                    joined.set()

    while True:
        i, t = marks.get(timeout=600)
        counts[i] = counts.get(i, 0) + 1
        if i in last and phase_of != "warm":
            gaps["join" if phase_of == "join" else "usual"].append(t - last[i])
        last[i] = t
        if phase_of == "warm" and len(counts) == clients and min(counts.values()) >= warm_tokens:
            phase_of, counts = "usual", {}
        elif phase_of == "usual" and len(counts) == clients and min(counts.values()) >= base_tokens:
            phase_of = "join"
            threading.Thread(target=joiner, daemon=True).start()
        elif phase_of == "join" and joined.is_set():
            break
    stop.set()
    return {"usual_p50_s": statistics.median(gaps["usual"]), "usual_p95_s": pct(gaps["usual"], 95),
            "join_p50_s": statistics.median(gaps["join"]), "join_p95_s": pct(gaps["join"], 95),
            "join_max_s": max(gaps["join"]), "join_gaps": len(gaps["join"]), "joiner_ttft_s": ttft["ttft"],
            "running_clients": clients}


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "vl" / "demo"))
    p.add_argument("--requests", type=int, default=64, help="distinct questions per phase (default 64: 8 per "
                   "client, and more media than the server's vision cache holds, so tiles are encoded as for new "
                   "requests)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="docs",
                   help="docs: answers as long as the model makes them (per-request work dominates); long: "
                        "ignore_eos, every answer exactly --max-tokens long (decoding dominates)")
    p.add_argument("--max-tokens", type=int, default=None, help="max_tokens per request (default: 64 for docs, "
                   "128 for long)")
    p.add_argument("--thinking", choices=["on", "off"], default="on", help="reasoning on (the model's default: "
                   "longer answers) or off")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--batch-window-ms", type=float, default=None, help="vl serve --batch-window-ms (default: "
                   "the server's)")
    p.add_argument("--prepare-workers", type=int, default=None, help="vl serve --prepare-workers (default: the "
                   "server's)")
    p.add_argument("--threads", type=int, default=1, help="vl serve --threads (default 1: on a busy 2-core machine "
                   "two torch threads wait on each other, measured 60 ms against 2.5 ms per decode step)")
    p.add_argument("--build", default=None, help="text workload: write a model to serve (180m, or a --geometry "
                   "name of vl bench with --layers and --format) into a temporary directory")
    p.add_argument("--layers", type=int, default=None, help="--build GEOMETRY: its first N layers")
    p.add_argument("--format", default="nvfp4", choices=("nvfp4", "fp8"), help="--build GEOMETRY: the format")
    p.add_argument("--prompt-tokens", type=int, default=128, help="text workload: tokens per prompt")
    p.add_argument("--join-tokens", type=int, default=None, help="text workload: after the throughput phases, a "
                   "prompt of this many tokens joins --clients - 1 streaming rows (inter-token gaps before / while)")
    p.add_argument("--mix-chunk", type=int, default=None, help="tokens of a joining prompt prefilled per decode "
                   "step (default: the runtime's; 0: all at once)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    default_tokens, extra_body = WORKLOADS[args.workload]
    args.max_tokens = args.max_tokens or default_tokens
    built = None  # the model --build writes (the 12B geometry's 8 layers: 3.3 GB), removed when the run ends
    if args.build:
        built = Path(tempfile.mkdtemp(prefix="vl-bench-lm-"))
        args.model = str(build_lm(args.build, built / args.build, args.layers, args.format))
    if args.workload == "text":
        qs = text_questions(args.requests, args.prompt_tokens, args.model)
    else:
        tile = json.loads((Path(args.model) / "config.json").read_text())["force_image_size"]
        qs = questions(args.requests, tile)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    extra = [] if args.batch_window_ms is None else ["--batch-window-ms", str(args.batch_window_ms)]
    extra += [] if args.prepare_workers is None else ["--prepare-workers", str(args.prepare_workers)]
    extra += [] if args.mix_chunk is None else ["--mix-chunk", str(args.mix_chunk)]
    serve = ["serve", "--model", args.model, "--port", str(port), "--max-batch", str(args.max_batch), "--max-queue",
             str(4 * args.clients), "--threads", str(args.threads), "--log-level", "warning", *extra]
    # `vl serve`'s media policy reads `processor.limits`, which a text-only model's processor lacks: the defaults
    start = ("import sys; from vl.processing.text_processor import TextProcessor; from vl.processing.limits import "
             "DEFAULT_LIMITS; TextProcessor.limits = getattr(TextProcessor, 'limits', DEFAULT_LIMITS); "
             f"from vl.cli import main; sys.exit(main({serve!r}))")
    server = subprocess.Popen([sys.executable, "-c", start], cwd=REPO, env=env)
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
            if server.poll() is not None:
                raise SystemExit("vl serve exited")
        on = args.thinking == "on"
        # warm-up: first calls, allocator growth, every batch size, and every question once, so that both phases
        # start from the same state of the server's vision cache
        phase(base, qs, args.clients, args.max_tokens, on, server.pid, extra_body)
        phase(base, qs[:2], 1, args.max_tokens, on, server.pid, extra_body)
        load0 = os.getloadavg()
        seq, conc = [], []
        for _ in range(args.rounds):
            seq.append(phase(base, qs, 1, args.max_tokens, on, server.pid, extra_body))
            conc.append(phase(base, qs, args.clients, args.max_tokens, on, server.pid, extra_body))
        joins = None
        if args.join_tokens:
            long_q = text_questions(1, args.join_tokens, args.model, seed=1)[0]
            joins = join_phase(base, qs, args.clients - 1, long_q, on)
        health = httpx.get(base + "/health").json()
    finally:
        server.terminate()
        server.wait(30)
        if built is not None:
            shutil.rmtree(built, ignore_errors=True)

    def summary(runs):
        wall = sum(r["wall_s"] for r in runs)
        lat = [x for r in runs for x in r["latencies_s"]]
        n, toks = sum(r["requests"] for r in runs), sum(r["tokens"] for r in runs)
        return {"requests_per_s": n / wall, "tokens_per_s": toks / wall, "p50_s": statistics.median(lat),
                "p95_s": pct(lat, 95), "requests": n, "completion_tokens": toks, "wall_s": wall,
                "server_cpu_ms_per_request": 1000 * sum(r["server_cpu_s"] for r in runs) / n,
                "client_cpu_ms_per_request": 1000 * sum(r["client_cpu_s"] for r in runs) / n,
                "requests_per_s_by_round": [r["requests"] / r["wall_s"] for r in runs]}

    s, c = summary(seq), summary(conc)
    ratios = [b / a for a, b in zip(s["requests_per_s_by_round"], c["requests_per_s_by_round"])]
    result = {"sequential": s, "concurrent": c, "speedup_requests_per_s": c["requests_per_s"] / s["requests_per_s"],
              "speedup_by_round": ratios, "speedup_median": statistics.median(ratios),
              "workload": args.workload, "extra_body": extra_body,
              "clients": args.clients, "max_batch": args.max_batch, "max_tokens": args.max_tokens,
              "requests": args.requests, "rounds": args.rounds, "thinking": args.thinking, "threads": args.threads,
              "batch_window_ms": args.batch_window_ms, "prepare_workers": args.prepare_workers,
              "batches": health.get("batches"), "joined": health.get("joined"), "served": health.get("served"),
              "load_avg_before": load0, "load_avg": os.getloadavg(), "cpu_threads": os.cpu_count(),
              "build": args.build, "layers": args.layers, "format": args.format if args.build not in (None, "180m")
              else None, "prompt_tokens": args.prompt_tokens, "mix_chunk": args.mix_chunk, "join": joins,
              "tokens_per_s_ratio": c["tokens_per_s"] / s["tokens_per_s"]}
    what = "document questions" if args.workload != "text" else f"text prompts of ~{args.prompt_tokens} tokens"
    print(f"model {args.build or args.model}" + (f" (first {args.layers} layers, {args.format})" if args.layers else ""))
    print(f"workload {args.workload}: {args.requests} {what}, max_tokens {args.max_tokens}"
          + (f", {json.dumps(extra_body)}" if extra_body else "")
          + f", reasoning {args.thinking}; {s['completion_tokens'] / s['requests']:.1f} completion tokens per "
            f"answer on average")
    if args.workload == "long" and s["completion_tokens"] + c["completion_tokens"] != (
            s["requests"] + c["requests"]) * args.max_tokens:
        print("warning: some answers were not exactly max_tokens long (does the server honour ignore_eos?)")
    print(f"one at a time : {s['requests_per_s']:.2f} req/s, {s['tokens_per_s']:.1f} tok/s, "
          f"p50 {s['p50_s']:.2f} s, p95 {s['p95_s']:.2f} s ({s['requests']} requests)")
    print(f"{args.clients} concurrent  : {c['requests_per_s']:.2f} req/s, {c['tokens_per_s']:.1f} tok/s, "
          f"p50 {c['p50_s']:.2f} s, p95 {c['p95_s']:.2f} s ({c['requests']} requests)")
    print(f"server CPU per request: {s['server_cpu_ms_per_request']:.1f} ms one at a time, "
          f"{c['server_cpu_ms_per_request']:.1f} ms concurrent; client CPU per request: "
          f"{s['client_cpu_ms_per_request']:.1f} / {c['client_cpu_ms_per_request']:.1f} ms")
    print("ratio by round: " + " ".join(f"{r:.2f}x" for r in ratios) + f" (median {result['speedup_median']:.2f}x)")
    print(f"throughput ratio (concurrent / one at a time): {result['speedup_requests_per_s']:.2f}x; "
          f"{health.get('batches')} batches and {health.get('joined')} joins for {health.get('served')} requests; "
          f"load average "
          f"{' '.join(f'{x:.1f}' for x in result['load_avg'])}")
    print(f"generated tokens/s ratio (concurrent / one at a time): {result['tokens_per_s_ratio']:.2f}x")
    if joins:
        print(f"a {args.join_tokens}-token prompt joining {joins['running_clients']} running rows (mix chunk "
              f"{args.mix_chunk if args.mix_chunk is not None else 'default'}): their inter-token gap p50 / p95 "
              f"{1000 * joins['usual_p50_s']:.0f} / {1000 * joins['usual_p95_s']:.0f} ms usually, "
              f"{1000 * joins['join_p50_s']:.0f} / {1000 * joins['join_p95_s']:.0f} ms while it joins (max "
              f"{1000 * joins['join_max_s']:.0f} ms, {joins['join_gaps']} gaps; p95 ratio "
              f"{joins['join_p95_s'] / joins['usual_p95_s']:.2f}x); its first token after {joins['joiner_ttft_s']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
