"""Bounded soak of the served app: mixed valid and bad requests at a steady rate, resources measured.

Reliability matrix row S11 / load level L4 (docs/reliability_policy.md §6.6): `vl app` runs as a subprocess on a
free port; gradio_client sends about `--rate` requests per second for `--duration` seconds, a fifth of them
(`--bad-fraction`) bad inputs drawn class by class (corrupt image, bomb PNG header, truncated MP4, encrypted
PDF, garbage PDF, PDF posing as a PNG, upload over the cap, bad parameters). The over-cap upload is sent
straight to /gradio_api/upload (gradio_client would refuse it before sending), so the server's 413 is what is
exercised. The app's process tree is sampled throughout: RSS of the server plus its decode workers, open
fds, process count, upload-folder and temp-dir entries. Pass criteria (docs/reliability_policy.md §6 "Service stays up" and row S11):

- errors only for the bad inputs: every valid request is answered, every bad one is refused with a clear
  message (an "Internal error" answer would mean an exception we did not type, so it counts as a failure);
- the server never dies;
- memory (RSS of server + children) grows less than 10 % from the warmed-up start to the end;
- fd count and process count are flat (end - start within a small tolerance for pooled sockets / workers).

    python scripts/soak.py [--model DIR] [--duration 600] [--rate 1.0] [--bad-fraction 0.2] [--out FILE]

Without --model it serves the shipped demo model when vl/demo/config.json exists, else a tiny random
checkpoint built by tests/tiny_models.py. Prints a JSON summary; exit status 0 when every criterion holds.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from ui.measure import free_port, multipart, raw_upload, vl_command, wait_served

REPO = Path(__file__).resolve().parents[1]
VALID = ("image", "pdf", "video", "chat")
BAD = ("corrupt_image", "bomb_png", "truncated_mp4", "encrypted_pdf", "garbage_pdf", "spoofed_png",
       "oversize_upload", "bad_params")
CRITERIA = {"max_memory_growth": 0.10, "max_fd_growth": 4, "max_process_growth": 0}
INTERNAL = "Internal error"  # ui.limits.user_error's answer to an exception that is not one of our typed errors


# --- the app ---------------------------------------------------------------------------------------------
def default_model(work: Path) -> tuple[str, str]:
    """(model dir, description): the shipped demo model if present, else a tiny random checkpoint."""
    demo = REPO / "vl" / "demo"
    if (demo / "config.json").is_file():
        return str(demo), "demo model (vl/demo)"
    sys.path[:0] = [str(REPO / "tests"), str(REPO)]
    from tiny_models import make_tiny_vl_dir

    path = work / "tiny_vl"
    path.mkdir(parents=True, exist_ok=True)
    make_tiny_vl_dir(path)
    return str(path), "tiny random checkpoint (tests/tiny_models.py make_tiny_vl_dir)"


def start_app(model: str, work: Path, port: int, max_upload_mb: int, queue_size: int, timeout_s: float):
    (work / "tmp").mkdir(exist_ok=True)  # the app's own TMPDIR, so that its temp files can be counted
    env = {**os.environ, "GRADIO_TEMP_DIR": str(work / "uploads"), "GRADIO_ANALYTICS_ENABLED": "False",
           "TMPDIR": str(work / "tmp")}
    log = open(work / "app.log", "w")
    proc = subprocess.Popen(vl_command() + ["app", "--model", model, "--port", str(port),
                                            "--examples-dir", str(work / "examples"),
                                            "--max-upload-mb", str(max_upload_mb), "--queue-size", str(queue_size),
                                            "--timeout", str(timeout_s)],
                            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def stop_app(proc: subprocess.Popen) -> int | None:
    if proc.poll() is None:
        proc.terminate()  # vl app stops like Ctrl-C on SIGTERM and removes its upload folder
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# --- resources -------------------------------------------------------------------------------------------
def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def sample(pid: int, work: Path) -> dict:
    procs, rss, fds, server_rss = [], 0, 0, 0
    for p in _tree(pid):
        try:
            mem = p.memory_info().rss
            rss += mem
            server_rss = mem if p.pid == pid else server_rss
            fds += p.num_fds()
            procs.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    try:
        server_fds = psutil.Process(pid).num_fds()
    except psutil.NoSuchProcess:
        server_fds = -1
    uploads = work / "uploads"
    files = [f for f in uploads.rglob("*") if f.is_file()] if uploads.exists() else []
    tmp = os.listdir(work / "tmp") if (work / "tmp").exists() else []
    return {"t": time.time(), "rss_bytes": rss, "rss_server_bytes": server_rss, "fds_tree": fds,
            "fds_server": server_fds, "processes": len(procs), "pids": procs, "upload_files": len(files),
            "upload_bytes": sum(f.stat().st_size for f in files), "temp_entries": len(tmp)}


# --- inputs ----------------------------------------------------------------------------------------------
def make_inputs(work: Path, examples: list[dict], examples_dir: Path, max_upload_mb: int) -> dict:
    """Fixed files for every class (content-addressed uploads then stay bounded in the upload folder)."""
    sys.path[:0] = [str(REPO / "tests" / "processing"), str(REPO)]
    from media_fixtures import make_pdf, png_header_only, red_square_page

    bad = work / "bad"
    bad.mkdir(parents=True, exist_ok=True)
    doc = [e for e in examples if e["kind"] in ("image", "pdf")]
    png = next(e for e in doc if e["path"].endswith(".png"))
    pdf = next(e for e in doc if e["path"].endswith(".pdf"))
    vid = next(e for e in examples if e["kind"] == "video")
    png_bytes, mp4_bytes = Path(png["path"]).read_bytes(), Path(vid["path"]).read_bytes()
    rng = random.Random(1234)
    files = {
        "corrupt_image": [(bad / "truncated.png", png_bytes[: len(png_bytes) // 2]),
                          (bad / "noise.png", bytes(rng.getrandbits(8) for _ in range(4000)))],
        "bomb_png": [(bad / "bomb.png", png_header_only(40000, 40000))],
        "truncated_mp4": [(bad / "cut.mp4", mp4_bytes[:1024]), (bad / "zero.mp4", b"")],
        "encrypted_pdf": [(bad / "locked.pdf", make_pdf([red_square_page()], user_password="s3cret"))],
        "garbage_pdf": [(bad / "garbage.pdf", b"%PDF-1.7\n" + bytes(rng.getrandbits(8) for _ in range(3000))),
                        (bad / "truncated.pdf", Path(pdf["path"]).read_bytes()[:600])],
        "spoofed_png": [(bad / "page.png", make_pdf([red_square_page()]))],
        "oversize_upload": [(bad / "huge.png", b"\x89PNG\r\n\x1a\n" + bytes((max_upload_mb << 20) + 4096))],
    }
    for variants in files.values():
        for path, data in variants:
            path.write_bytes(data)
    return {"png": png, "pdf": pdf, "video": vid, "bad": {k: [str(p) for p, _ in v] for k, v in files.items()}}


def doc_args(files, question, pages="", max_tiles=2, max_new_tokens=8, temperature=0.0):
    return [files, pages, question, max_tiles, 0, False, 0, max_new_tokens, temperature]


def video_args(video, question, max_frames=4, max_new_tokens=8):
    return [video, question, 2.0, max_frames, 0.5, False, 0, max_new_tokens, 0.0]


def request_for(kind: str, inputs: dict, k: int, max_new_tokens: int):
    """(api_name, args) for one request of class `kind`; `k` picks the variant within a class."""
    from gradio_client import handle_file

    png, pdf, vid = inputs["png"], inputs["pdf"], inputs["video"]
    if kind == "image":
        return "/document", doc_args([handle_file(png["path"])], png["question"], max_new_tokens=max_new_tokens)
    if kind == "pdf":
        return "/document", doc_args([handle_file(pdf["path"])], pdf["question"], pages="1-2",
                                     max_new_tokens=max_new_tokens)
    if kind == "video":
        return "/video", video_args(handle_file(vid["path"]), vid["question"], max_new_tokens=max_new_tokens)
    if kind == "chat":
        return "/chat", [{"text": "Describe the image.", "files": []}, False, 0, max_new_tokens, 0.0, 2, 2.0, 4, 0.0]
    if kind == "bad_params":
        variant = k % 4
        if variant == 0:  # page range outside the 4-page PDF
            return "/document", doc_args([handle_file(pdf["path"])], pdf["question"], pages="7-9")
        if variant == 1:  # wrong type (the API accepts any JSON)
            return "/document", doc_args([handle_file(png["path"])], png["question"], temperature="hot")
        if variant == 2:  # not a whole number of tiles
            return "/document", doc_args([handle_file(png["path"])], png["question"], max_tiles=2.5)
        return "/document", doc_args([handle_file(png["path"])], "   ")  # no question
    variants = inputs["bad"][kind]
    path = variants[k % len(variants)]
    if kind == "truncated_mp4":
        return "/video", video_args(handle_file(path), "What happens?")
    return "/document", doc_args([handle_file(path)], "What is the total?")


# --- the run ---------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    seq: int
    kind: str
    bad: bool
    ok: bool
    latency_s: float
    message: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, o: Outcome):
        with self.lock:
            self.outcomes.append(o)


def one_request(client, kind: str, seq: int, inputs: dict, max_new_tokens: int, timeout_s: float) -> Outcome:
    t0 = time.perf_counter()
    bad = kind in BAD
    if kind == "oversize_upload":
        try:
            path = inputs["bad"][kind][0]
            status, body = raw_upload(inputs["url"], multipart(Path(path).name.encode(), Path(path).read_bytes(), b"image/png"),
                                      timeout_s)
        except OSError as exc:
            return Outcome(seq, kind, bad, False, time.perf_counter() - t0, f"no HTTP answer: {exc!r}"[:300])
        if status == 413:
            return Outcome(seq, kind, bad, False, time.perf_counter() - t0,
                           f"HTTP 413: {body.decode(errors='replace')}"[:300])
        return Outcome(seq, kind, bad, status == 200, time.perf_counter() - t0,
                       f"HTTP {status}: {body[:200]!r}" if status != 200 else "")
    try:
        api, args = request_for(kind, inputs, seq, max_new_tokens)
        job = client.submit(*args, api_name=api)
        out = job.result(timeout=timeout_s)
        answered = bool(out) and (api == "/chat" or "finished by" in str(out[-1]))
        message = "" if answered else f"no answer: {out!r}"[:300]
        return Outcome(seq, kind, bad, answered, time.perf_counter() - t0, message)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and classified
        return Outcome(seq, kind, bad, False, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:300])


def schedule(n: int, bad_fraction: float, seed: int) -> list[str]:
    """n request kinds: round(n * bad_fraction) bad ones cycling through the bad classes, the rest valid, shuffled."""
    n_bad = round(n * bad_fraction)
    kinds = [BAD[i % len(BAD)] for i in range(n_bad)] + [VALID[i % len(VALID)] for i in range(n - n_bad)]
    random.Random(seed).shuffle(kinds)
    return kinds


def run(args) -> dict:
    from gradio_client import Client

    work = Path(tempfile.mkdtemp(prefix="vl-soak-"))
    model, model_desc = (args.model, args.model) if args.model else default_model(work)
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}/"
    t_boot = time.perf_counter()
    proc, log = start_app(model, work, port, args.max_upload_mb, args.queue_size, args.request_timeout)
    summary: dict = {"model": model_desc, "url": url, "duration_s": args.duration, "rate_per_s": args.rate,
                     "bad_fraction": args.bad_fraction, "criteria": CRITERIA}
    try:
        summary["startup_s"] = round(wait_served(url, proc, args.startup_timeout, poll=0.25,
                                                   describe_exit=lambda: (work / "app.log").read_text()[-3000:]), 1)
        sys.path[:0] = [str(REPO)]
        from ui.examples import ensure_examples, tab_examples

        ex_dir, records = ensure_examples(work / "examples")
        tabs = tab_examples(ex_dir, records)
        examples = [dict(e, kind="pdf" if e["path"].endswith(".pdf") else "image") for e in tabs["document"]]
        examples += [dict(e, kind="video") for e in tabs["video"]]
        inputs = make_inputs(work, examples, ex_dir, args.max_upload_mb)
        inputs["url"] = url
        clients = [Client(url, verbose=False, download_files=False) for _ in range(args.clients)]

        # warm-up: one request of every class, so that pools, workers and caches exist before the baseline
        warm = Tally()
        for i, kind in enumerate(VALID + BAD):
            warm.add(one_request(clients[0], kind, i, inputs, args.max_new_tokens, args.request_timeout + 60))
        summary["warmup"] = {o.kind: ("ok" if o.ok else o.message[:160]) for o in warm.outcomes}
        time.sleep(args.settle)
        start = sample(proc.pid, work)

        n = max(1, int(round(args.duration * args.rate)))
        kinds = schedule(n, args.bad_fraction, args.seed)
        jobs: queue.Queue = queue.Queue()
        tally = Tally()
        samples = [start]
        seen_pids = set(start["pids"])
        stop_sampling = threading.Event()

        def sampler():
            while not stop_sampling.wait(args.sample_every):
                if proc.poll() is not None:
                    return
                s = sample(proc.pid, work)
                seen_pids.update(s["pids"])
                samples.append(s)

        def worker(client):
            while True:
                item = jobs.get()
                if item is None:
                    return
                seq, kind = item
                tally.add(one_request(client, kind, seq, inputs, args.max_new_tokens, args.request_timeout + 60))

        threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients]
        threads.append(threading.Thread(target=sampler, daemon=True))
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        for seq, kind in enumerate(kinds):  # about `rate` requests per second, whatever their latency
            delay = t0 + seq / args.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if proc.poll() is not None:
                break
            jobs.put((seq, kind))
        for _ in clients:
            jobs.put(None)
        for t in threads[:-1]:
            t.join(timeout=args.request_timeout + 120)
        stop_sampling.set()
        threads[-1].join(timeout=30)
        wall = time.perf_counter() - t0
        time.sleep(args.settle)
        alive = proc.poll() is None
        end = sample(proc.pid, work) if alive else None
        summary.update(summarize(tally.outcomes, start, end, samples, seen_pids, wall, alive, n))
    finally:
        summary["app_exit_status"] = stop_app(proc)
        log.close()
        summary["app_log_tail"] = (work / "app.log").read_text(errors="replace")[-1500:]
        summary["total_s"] = round(time.perf_counter() - t_boot, 1)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            summary["work_dir"] = str(work)
    return summary


def summarize(outcomes: list[Outcome], start: dict, end: dict | None, samples: list[dict], seen_pids: set,
              wall: float, alive: bool, planned: int) -> dict:
    valid = [o for o in outcomes if not o.bad]
    bad = [o for o in outcomes if o.bad]
    by_class = {}
    for kind in VALID + BAD:
        mine = [o for o in outcomes if o.kind == kind]
        if mine:
            by_class[kind] = {"tried": len(mine), "answered": sum(o.ok for o in mine),
                              "refused": sum(not o.ok for o in mine),
                              "example_message": next((o.message[:200] for o in mine if o.message), "")}
    internal = [o for o in bad if INTERNAL in o.message]
    lat = sorted(o.latency_s for o in valid)

    def pct(p):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None

    out = {
        "requests_planned": planned, "requests_sent": len(outcomes), "wall_s": round(wall, 1),
        "requests_per_s": round(len(outcomes) / max(wall, 1e-9), 2),
        "valid": {"sent": len(valid), "served": sum(o.ok for o in valid),
                  "errors": [asdict(o) for o in valid if not o.ok][:10],
                  "latency_p50_s": pct(0.5), "latency_p95_s": pct(0.95)},
        "bad": {"sent": len(bad), "refused_clearly": sum(not o.ok and INTERNAL not in o.message for o in bad),
                "answered_anyway": [asdict(o) for o in bad if o.ok][:10],
                "internal_errors": [asdict(o) for o in internal][:10]},
        "by_class": by_class,
        "server_alive_at_end": alive,
        "crashes_contained": sum(not o.ok for o in bad) if alive else 0,
        "decode_worker_pids_seen": len(seen_pids - {start["pids"][0]}),
        "start": {k: v for k, v in start.items() if k != "pids"},
        "end": None if end is None else {k: v for k, v in end.items() if k != "pids"},
        "peak_rss_bytes": max(s["rss_bytes"] for s in samples),
        "peak_processes": max(s["processes"] for s in samples),
        "samples": [{k: s[k] for k in ("t", "rss_bytes", "rss_server_bytes", "fds_tree", "fds_server", "processes",
                                       "upload_files", "temp_entries")}
                    for s in samples],
    }
    checks = {"server_alive": alive,
              "every_valid_request_served": bool(valid) and all(o.ok for o in valid),
              "errors_only_for_bad_inputs": all(o.ok for o in valid),
              "bad_inputs_refused_clearly": not internal and all(not o.ok for o in bad),
              "all_planned_requests_sent": len(outcomes) == planned}
    if end is not None:
        growth = (end["rss_bytes"] - start["rss_bytes"]) / start["rss_bytes"]
        out["memory_growth"] = round(growth, 4)
        out["memory_growth_server_only"] = round((end["rss_server_bytes"] - start["rss_server_bytes"])
                                                 / start["rss_server_bytes"], 4)
        out["rss_slope_second_half_mb_per_min"] = slope_mb_per_min(samples[len(samples) // 2:])
        out["fd_growth_server"] = end["fds_server"] - start["fds_server"]
        out["fd_growth_tree"] = end["fds_tree"] - start["fds_tree"]
        out["process_growth"] = end["processes"] - start["processes"]
        checks["memory_growth_under_10pct"] = growth < CRITERIA["max_memory_growth"]
        checks["fd_count_flat"] = out["fd_growth_server"] <= CRITERIA["max_fd_growth"]
        checks["process_count_flat"] = out["process_growth"] <= CRITERIA["max_process_growth"]
        checks["temp_dir_flat"] = end["temp_entries"] <= start["temp_entries"]
    out["checks"] = checks
    out["passed"] = all(checks.values()) and end is not None
    return out


def slope_mb_per_min(samples: list[dict]) -> float | None:
    """Least-squares slope of the tree RSS over `samples`: a leak shows as a steady positive slope."""
    if len(samples) < 3:
        return None
    ts = [s["t"] for s in samples]
    ys = [s["rss_bytes"] / 2**20 for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return round(60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var, 3) if var else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint dir (default: vl/demo if present, else a tiny one)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of requests after warm-up (default 600)")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    p.add_argument("--bad-fraction", type=float, default=0.2)
    p.add_argument("--clients", type=int, default=3, help="concurrent client connections (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--max-upload-mb", type=int, default=2, help="the app's upload cap; the oversize input exceeds it")
    p.add_argument("--queue-size", type=int, default=16)
    p.add_argument("--request-timeout", type=float, default=60.0, help="the app's per-request time limit")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settle", type=float, default=3.0, help="idle seconds before the start and end samples")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--out", default=None, help="also write the JSON summary here")
    p.add_argument("--keep", action="store_true", help="keep the work folder (app log, inputs)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = run(args)
    text = json.dumps(summary, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    verdict = "PASS" if summary.get("passed") else "FAIL"
    failed = [k for k, v in summary.get("checks", {}).items() if not v]
    print(f"soak: {verdict}" + (f" (failed: {', '.join(failed)})" if failed else ""), file=sys.stderr)
    return 0 if summary.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
