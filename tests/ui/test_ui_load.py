"""Load (docs/reliability_policy.md §6.6 L2/S2): 8 clients at once against a 2-deep queue with one model slot.

Every request either completes or is refused at once as queue-full; none hangs; the app then answers a new
request.
"""

from __future__ import annotations

import threading
import time

import pytest
from gradio_client import Client, handle_file
from ui_helpers import document_args

pytestmark = pytest.mark.timeout(240)


def test_eight_concurrent_clients_complete_or_are_refused(cli_app, examples):
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(".png"))
    n = 8
    clients = [Client(cli_app.url, verbose=False, download_files=False) for _ in range(n)]
    start = threading.Barrier(n)
    outcome: list[tuple[str, float, str]] = [("none", 0.0, "")] * n

    def one(i):
        start.wait()
        t0 = time.perf_counter()
        try:
            out = clients[i].predict(*document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=8),
                                     api_name="/document")
            outcome[i] = ("ok" if out[1] and "finished by" in out[3] else "bad", time.perf_counter() - t0, out[3])
        except Exception as exc:  # noqa: BLE001 - classified below
            kind = "queue_full" if "queue is full" in str(exc).lower() else "error"
            outcome[i] = (kind, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + 120
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    assert not any(t.is_alive() for t in threads), "a request hung"
    kinds = [k for k, _, _ in outcome]
    assert set(kinds) <= {"ok", "queue_full"}, outcome
    assert kinds.count("ok") >= 1 and kinds.count("queue_full") >= 1, outcome
    refused_after = [s for k, s, _ in outcome if k == "queue_full"]
    done_after = [s for k, s, _ in outcome if k == "ok"]
    print(f"load: {len(done_after)} completed (slowest {max(done_after):.1f} s), {len(refused_after)} refused as "
          f"queue-full (slowest refusal {max(refused_after):.2f} s)")
    assert max(refused_after) < 10, f"refusals must be immediate, took {refused_after}"

    t0 = time.perf_counter()
    out = Client(cli_app.url, verbose=False, download_files=False).predict(
        *document_args([handle_file(ex["path"])], ex["question"], max_new_tokens=4), api_name="/document")
    assert out[1] and time.perf_counter() - t0 < 30
