"""`vl serve` throughput: 8 concurrent clients against one client at a time, on the demo model.

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
Reports requests/s and completion tokens/s of each phase, their ratio (overall and per round, with the
median), p50/p95 request latency, and the CPU time the server (its threads and its media-decoding sandbox
workers) and the client used per request: on a machine shared with other work the CPU per request is the
steadier figure. The server joins requests that arrive while a batch decodes into it (continuous batching),
and /health counts them.

Fairness: both phases send the same questions; the warm-up sends every question once, so both start from the
same state of the server's vision cache (with the default 64 questions, more media than that cache holds, so
tiles are encoded as for new requests in both phases); the server runs with --threads 1 (default), and the
client's own CPU use is reported so that it can be seen not to starve the server.

Usage: PYTHONPATH=. .venv/bin/python scripts/bench_server.py [--workload docs|long] [--requests 64] [--clients 8]
       [--rounds 2] [--max-tokens N] [--max-batch 8] [--batch-window-ms MS] [--prepare-workers N] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
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


WORKLOADS = {"docs": (64, {}), "long": (128, {"ignore_eos": True})}  # default --max-tokens, extra body fields


def ask(client: httpx.Client, base: str, q: dict, max_tokens: int, thinking: bool,
        extra: dict | None = None) -> tuple[float, int]:
    body = {"messages": [{"role": "user", "content": [q["media"], {"type": "text", "text": q["question"]}]}],
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
    p.add_argument("--json", default=None)
    args = p.parse_args()
    default_tokens, extra_body = WORKLOADS[args.workload]
    args.max_tokens = args.max_tokens or default_tokens
    tile = json.loads((Path(args.model) / "config.json").read_text())["force_image_size"]
    qs = questions(args.requests, tile)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    extra = [] if args.batch_window_ms is None else ["--batch-window-ms", str(args.batch_window_ms)]
    extra += [] if args.prepare_workers is None else ["--prepare-workers", str(args.prepare_workers)]
    server = subprocess.Popen([sys.executable, "-m", "vl.cli", "serve", "--model", args.model, "--port", str(port),
                               "--max-batch", str(args.max_batch), "--max-queue", str(4 * args.clients),
                               "--threads", str(args.threads), "--log-level", "warning", *extra], cwd=REPO, env=env)
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
        health = httpx.get(base + "/health").json()
    finally:
        server.terminate()
        server.wait(30)

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
              "load_avg_before": load0, "load_avg": os.getloadavg(), "cpu_threads": os.cpu_count()}
    print(f"workload {args.workload}: {args.requests} document questions, max_tokens {args.max_tokens}"
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
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
