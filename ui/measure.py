"""What a user of `vl app` waits for, measured from outside: start -> ready page, and per question the time to
the first answer text and the tokens/s as a client sees them (gradio_client streaming, bundled examples).

    python -m ui.measure [--model PATH] [--port 7861] [--max-new-tokens 64] [--json]

Starts the real `vl app` command in a subprocess (so the start-up time includes imports and model loading,
with `.venv` already installed), waits for its page, then asks the document and video examples. Client
tokens/s = (new tokens - 1) / (time of the last text - time of the first text), new tokens from the app's stats
(updates are sent at most every 50 ms, so on short answers this overestimates; the server's own decode speed is
reported next to it). The first question runs after a warm-up on another file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from ui.examples import ensure_examples, tab_examples


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vl_command() -> list[str]:
    """The installed `vl` entry point of this interpreter's environment (or the module behind it)."""
    exe = Path(sys.executable).parent / "vl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "vl.cli"]


def wait_served(url: str, proc: subprocess.Popen, timeout: float, *, describe_exit=None, poll: float = 0.2) -> float:
    """Seconds until `url` answers 200 with the Gradio page. RuntimeError if the app exits first or `timeout`
    passes, with `describe_exit()` appended (e.g. the tail of the app's log). Shared by this module, the soak
    (scripts/soak.py) and the UI tests."""
    def fail(msg: str):
        extra = describe_exit() if describe_exit else ""
        raise RuntimeError(msg + (f":\n{extra}" if extra else ""))

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            fail(f"vl app exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and b"gradio" in r.read().lower():
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(poll)
    fail(f"vl app did not serve {url} within {timeout} s")


def multipart(filename: bytes, body: bytes, ctype: bytes = b"application/octet-stream") -> bytes:
    """A multipart/form-data body (boundary "B") holding one file in the field Gradio's upload route reads."""
    return (b'--B\r\nContent-Disposition: form-data; name="files"; filename="' + filename + b'"\r\n'
            b"Content-Type: " + ctype + b"\r\n\r\n" + body + b"\r\n--B--\r\n")


def raw_upload(url: str, payload: bytes, timeout: float = 60) -> tuple[int, bytes]:
    """POST a `multipart` body to the app's /gradio_api/upload over a raw socket: (HTTP status, body); (0, b"")
    when nothing came back. Shared by the soak (scripts/soak.py) and the serving tests.

    A raw socket reads the server's answer even when the server stops reading the request early (it answers 413
    and closes): urllib would report only the broken pipe, and gradio_client refuses an over-cap file itself,
    before sending it.
    """
    host, port = url.split("//")[1].strip("/").split(":")
    head = (f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            f"Content-Type: multipart/form-data; boundary=B\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head)
        try:
            for i in range(0, len(payload), 1 << 16):
                s.sendall(payload[i:i + (1 << 16)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading everything
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    if not data:
        return 0, b""
    return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[-1]


def ask(client, api_name: str, args: list) -> dict:
    t0 = time.perf_counter()
    job = client.submit(*args, api_name=api_name)
    first = last = None
    text = ""
    for out in job:
        now = time.perf_counter()
        grown = (out[0] or "") + (out[1] or "")
        if grown and grown != text:
            first = first or now
            last, text = now, grown
    final = job.result()
    stats = final[-1]
    new = int(re.search(r"\| new tokens \| (\d+) \|", stats).group(1))
    server_ttft = float(re.search(r"\| time to first token \| ([\d.]+) s \|", stats).group(1))
    server_tps = float(re.search(r"\| decode speed \| ([\d.]+) tokens/s \|", stats).group(1))
    span = (last - first) if first and last else 0.0
    return {"client_first_text_s": round((first or time.perf_counter()) - t0, 3),
            "client_tokens_per_s": round((new - 1) / span, 1) if span > 0 and new > 1 else None,
            "server_ttft_s": server_ttft, "server_decode_tokens_per_s": server_tps, "new_tokens": new,
            "total_s": round(time.perf_counter() - t0, 3),
            "answer": final[1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ui.measure", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from gradio_client import Client, handle_file


    examples_dir, records = ensure_examples()
    tabs = tab_examples(examples_dir, records)
    port = args.port or free_port()
    cmd = vl_command() + ["app", "--port", str(port)]
    cmd += ["--model", args.model] if args.model else []
    env = {**os.environ, "GRADIO_TEMP_DIR": tempfile.mkdtemp(prefix="vl-measure-")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        try:
            ready_s = wait_served(url, proc, 600, poll=0.1)
        except RuntimeError as e:
            raise SystemExit(str(e)) from None
        report = {"command": " ".join(cmd), "start_to_ready_page_s": round(ready_s, 2)}
        client = Client(url, verbose=False, download_files=False)
        doc = next(e for e in tabs["document"] if e["path"].endswith(".png"))
        pdf = next(e for e in tabs["document"] if e["path"].endswith(".pdf"))
        n = args.max_new_tokens
        # warm-up on another file (a decode worker starts; the measured page must not hit the vision cache)
        ask(client, "/document", [[handle_file(pdf["path"])], "1", pdf["question"], 12, 0, False, 0, 2, 0.0])
        report["document"] = ask(client, "/document", [[handle_file(doc["path"])], "", doc["question"], 12, 0,
                                                        False, 0, n, 0.0])
        vid = tabs["video"][0]
        report["video"] = ask(client, "/video", [handle_file(vid["path"]), vid["question"], 2.0, 128, 0.5, False, 0,
                                                 n, 0.0])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps(report, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
