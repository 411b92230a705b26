"""`vl eval --backend openai` (the CLI, as a subprocess) against a server that drops a stream mid-way, stalls, ends a
stream early, goes away and comes back (tests/server/fake_openai.py on a loopback port): no item is lost. A broken
reply is a retriable `unavailable` record, `--resume` redoes exactly those, a run whose server is gone stops after
`--max-connection-failures` items in a row with a message and a non-zero exit, and a run that answered nothing
prints no score."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "server"))
from fake_openai import (  # noqa: E402
    FakeOpenAI,
    chunk,
    chunked,
    cut_after,
    head,
    raw,
    reply_then_leave,
    sse,
    stall,
    status,
)

ITEMS = [f"q{i}" for i in range(1, 9)]
FAULTS = {"q2": cut_after(sse(chunk("4"), done=False)),           # the connection drops mid-stream
          "q4": stall(sse(chunk("4"), done=False)),               # the server stops sending
          "q6": raw(head() + chunked(sse(chunk("4"), done=False)))}  # the stream ends: no finish_reason, no [DONE]


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"id": q, "question": q, "answer": "42", "family": "doc_total"}) + "\n"
                            for q in ITEMS))
    return path


def vl_eval(data: Path, out: Path, url: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "vl.cli", "eval", "--no-progress", "--task", "synthetic_docs",
                           "--data", str(data), "--out", str(out), "--backend", "openai", "--base-url", url,
                           "--concurrency", "1", "--retries", "0", "--read-timeout", "2", "--max-attempts", "2",
                           *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def final_records(out: Path) -> dict:
    return {r["id"]: r for r in map(json.loads, (out / "predictions.jsonl").read_text().splitlines())}


def test_dropped_stalled_and_cut_streams_are_redone_by_resume_after_the_server_left_and_came_back(data, tmp_path):
    out = tmp_path / "run"
    fake = FakeOpenAI(behaviours=FAULTS)
    port = fake.port
    try:
        first = vl_eval(data, out, fake.base_url)
        assert sum(fake.chat_requests.values()) == len(ITEMS)  # one request each: nothing resent in the run
    finally:
        fake.close()
    records = final_records(out)
    assert {q for q, r in records.items() if r["status"] == "ok"} == set(ITEMS) - set(FAULTS)
    for q in FAULTS:
        assert (records[q]["error_class"], records[q]["retriable"]) == ("unavailable", True), records[q]
    assert first.returncode == 1, first.stderr[-2000:]
    assert "3 items could not reach the server" in first.stderr and "--resume" in first.stderr

    # the server is gone (its model named, so the run can start): the resume stops after 2 items in a row, says
    # so, and leaves the rest
    gone = vl_eval(data, out, fake.base_url, "--resume", "--max-connection-failures", "2", "--served-model", "fake")
    assert gone.returncode == 1, gone.stderr[-2000:]
    assert "stopped: 2 items in a row could not reach the server" in gone.stderr
    assert "1 item not run" in gone.stderr
    assert json.loads(gone.stdout)["ok"] == 5

    # it is back at the same address: the resume runs exactly the three items, once each, and completes
    with FakeOpenAI(port=port) as back:
        done = vl_eval(data, out, back.base_url, "--resume")
        assert dict(back.chat_requests) == {q: 1 for q in FAULTS}
    assert done.returncode == 0, done.stderr[-2000:]
    assert "5 done, 3 to run" in done.stderr
    summary = json.loads(done.stdout)
    assert (summary["ok"], summary["error"], summary["missing"], summary["score"]) == (8, 0, 0, 1.0)


def test_a_server_that_goes_away_mid_run_stops_the_run_after_three_items(data, tmp_path):
    with FakeOpenAI(behaviours={"q3": reply_then_leave()}) as fake:
        run = vl_eval(data, tmp_path / "run", fake.base_url)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "stopped: 3 items in a row could not reach the server" in run.stderr and "2 items not run" in run.stderr
    assert run.stderr.count("the server did not answer") == 3  # each one said as it happens
    printed = json.loads(run.stdout)
    assert (printed["ok"], printed["unavailable"], printed["missing"], printed["score"]) == (3, 3, 2, 0.5)


def test_a_run_against_no_server_stops_and_prints_no_score(data, tmp_path):
    fake = FakeOpenAI()
    url = fake.base_url
    fake.close()
    unknown = vl_eval(data, tmp_path / "unknown", url)  # the model id (part of the fingerprint) cannot be read
    assert unknown.returncode == 2 and "error [unavailable]" in unknown.stderr and "is the server up?" in unknown.stderr
    run = vl_eval(data, tmp_path / "run", url, "--served-model", "fake")
    assert run.returncode == 1, run.stderr[-2000:]
    assert "stopped: 3 items in a row could not reach the server" in run.stderr and "5 items not run" in run.stderr
    printed = json.loads(run.stdout)
    assert printed["score"] is None and printed["ok"] == 0 and "no answers" in printed["note"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["scores"]["score"] is None and summary["counts"]["unavailable"] == 3
    assert "no answers" in (tmp_path / "run" / "summary.md").read_text().splitlines()[0]


def test_a_gateway_error_page_and_a_good_answer_next_to_it(data, tmp_path):
    """A 502 page from a proxy is retried by the client and recorded `unavailable` (not `internal_error`); the
    neighbours are answered."""
    with FakeOpenAI(behaviours={"q3": status(502, "<html>Bad Gateway</html>", "text/html")}) as fake:
        run = vl_eval(data, tmp_path / "run", fake.base_url)
        assert fake.chat_requests["q3"] == 4  # RemoteEngine's own retries (3), then the record
    records = final_records(tmp_path / "run")
    assert records["q3"]["error_class"] == "unavailable" and records["q3"]["retriable"]
    assert all(records[q]["status"] == "ok" and records[q]["prediction"] == "42" for q in ITEMS if q != "q3")
    assert run.returncode == 1 and "1 item could not reach the server" in run.stderr
