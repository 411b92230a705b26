"""eval.runner with a stand-in model (tests/eval/runner_fakes.py): records, resume, faults, sharding, sweep.

Rows of docs/reliability_policy.md §6.7: E1 (SIGKILL then resume), E2 (torn last line), E4 (transient
errors), E5 (fingerprint change), E6 (identical reruns), E7 (disk full), E8 (per-item timeout). E3 (poison
media) runs through the real processor in test_runner_e2e.py.
"""

import dataclasses
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from runner_fakes import FACTS, FakeBackend

import eval.records as records_mod
from eval.__main__ import main as cli_main
from eval.backend import ProcessBackend
from eval.data import DatasetFormatError
from eval.records import RecordsWriteError, RecordWriter, iter_records, repair_tail
from eval.runner import Dist, OutputExistsError, RunConfig, Runner, classify, file_digest
from eval.score import summarize
from eval.sweep import parse_sweep, run_sweep
from vl.errors import CorruptMediaError, DecodeTimeoutError, RemoteMediaError

N = 9


def make_data(folder: Path, n: int = N, special: dict | None = None) -> Path:
    """JSONL for the synthetic_docs task; every other item carries its answer so scores are not all 0."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(folder / "page.png")
    rows = []
    for i in range(n):
        question = f"Q{i} ANSWER=a{i}" if i % 2 == 0 else f"Q{i} what?"
        question = (special or {}).get(i, question)
        rows.append({"id": f"q{i}", "question": question, "answer": f"a{i}", "family": f"fam{i % 3}",
                     "image": "page.png", "chance": 0.1})
    path = folder / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def config(data: Path, out: Path, **kw) -> RunConfig:
    return RunConfig(task="synthetic_docs", data=str(data), out=str(out), progress=False, decode_sandbox=False,
                     isolation="inline", device="cpu", **kw)


def run(cfg, backend=None, facts=FACTS, **kw):
    return Runner(cfg, backend=backend or FakeBackend(), facts=facts, log=lambda m: None, **kw).run()


def predictions(out: Path) -> list[dict]:
    return list(iter_records(out / "predictions.jsonl"))


def without_timing(recs):
    return [{k: v for k, v in r.items() if k != "timing"} for r in recs]


def stable(summary: dict) -> dict:
    """The summary minus the parts that legitimately differ between runs (wall time, code versions, paths)."""
    s = {k: v for k, v in summary.items() if k != "run"}
    s["header"] = {k: v for k, v in s["header"].items() if k != "data"}
    return s


def log_records(out: Path) -> list[dict]:
    return [r for p in sorted((out / "records").glob("rank*.jsonl")) for r in iter_records(p)]


# ------------------------------------------------------------------------------------------------------


def test_run_writes_one_record_per_item_and_a_summary_with_the_run_header(tmp_path):
    data = make_data(tmp_path / "d")
    summary = run(config(data, tmp_path / "o"))
    recs = predictions(tmp_path / "o")
    assert [r["id"] for r in recs] == [f"q{i}" for i in range(N)]  # dataset order
    assert all(r["status"] == "ok" and r["attempt"] == 1 and r["fingerprint"] == recs[0]["fingerprint"] for r in recs)
    assert recs[0]["prediction"] == "a0" and recs[1]["prediction"] == "no idea"
    assert summary["scores"]["score"] == pytest.approx(5 / 9)
    assert summary["scores"] == summarize("synthetic_docs", recs)  # same numbers as `vl eval score`
    head = summary["header"]
    for key in ("harness", "task", "reference", "prompt_suffix", "max_new_tokens", "reasoning_mode", "fps",
                "max_frames", "max_num_tiles", "evs_rate", "precision", "seeds", "fingerprint", "split"):
        assert key in head, key
    assert head["reasoning_mode"] == "/no_think" and head["max_new_tokens"] == 32
    assert summary["tokens"]["vision_before"]["total"] == 16 * N and summary["counts"]["complete"]
    assert summary["scores"]["categories"]["family"]["fam0"]["n"] == 3
    md = (tmp_path / "o" / "summary.md").read_text()
    assert "exact_match_normalized" in md and "/no_think" in md and "fam1" in md
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["scores"] == summary["scores"]


def test_existing_output_needs_resume_and_resume_skips_finished_items(tmp_path):
    data = make_data(tmp_path / "d")
    first = run(config(data, tmp_path / "o"))
    with pytest.raises(OutputExistsError, match="--resume"):
        run(config(data, tmp_path / "o"))
    backend = FakeBackend()
    again = run(config(data, tmp_path / "o", resume=True), backend)
    assert backend.calls == 0 and stable(again) == stable(first)
    assert len(log_records(tmp_path / "o")) == N


def test_torn_last_line_is_cut_and_that_item_redone(tmp_path):  # E2
    data = make_data(tmp_path / "d")
    first = run(config(data, tmp_path / "o"))
    log = tmp_path / "o" / "records" / "rank0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # half of the last record
    backend = FakeBackend()
    again = run(config(data, tmp_path / "o", resume=True), backend)
    assert sum(backend.items.values()) == 1 and stable(again) == stable(first)
    assert without_timing(predictions(tmp_path / "o")) == without_timing(
        [json.loads(line) for line in lines])  # same records, same order
    assert len(log_records(tmp_path / "o")) == N and log.read_bytes().endswith(b"\n")


def test_repair_tail_cases(tmp_path):
    f = tmp_path / "log.jsonl"
    f.write_bytes(b'{"a": 1}\n{"b": 2')
    assert repair_tail(f) == 7 and f.read_bytes() == b'{"a": 1}\n'
    assert repair_tail(f) == 0
    f.write_bytes(b'{"torn')
    assert repair_tail(f) == 6 and f.read_bytes() == b""
    assert repair_tail(tmp_path / "absent.jsonl") == 0
    f.write_bytes(b'{"a": 1}\nnot json\n{"c": 3}\n')
    with pytest.raises(Exception, match="log.jsonl:2"):
        list(iter_records(f))


_KILL_SCRIPT = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
from runner_fakes import FACTS, FakeBackend
from eval.runner import RunConfig, Runner
cfg = RunConfig(**json.loads(sys.argv[2]))
Runner(cfg, backend=FakeBackend(delay_s=0.03), facts=FACTS, log=lambda m: None).run()
"""


def test_sigkill_at_random_items_then_resume_matches_an_uninterrupted_run(tmp_path):  # E1
    n = 40
    data = make_data(tmp_path / "d", n=n)
    reference = run(config(data, tmp_path / "ref"))
    out = tmp_path / "killed"
    cfg = dataclasses.asdict(config(data, out, resume=True))
    log = out / "records" / "rank0.jsonl"
    rng = random.Random(1)
    kills = 0
    for _ in range(5):
        done = len(list(iter_records(log))) if log.exists() else 0
        if done >= n - 3:
            break
        target = rng.randint(done + 1, min(done + 8, n - 2))
        proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, json.dumps(sys.path), json.dumps(cfg)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and len(log.read_bytes().splitlines()) >= target:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 3
    resumed = run(config(data, out, resume=True))
    ids = [r["id"] for r in log_records(out)]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n)), "an item is missing or duplicated in the log"
    assert without_timing(predictions(out)) == without_timing(predictions(tmp_path / "ref"))
    assert stable(resumed) == stable(reference)


def test_two_runs_give_identical_predictions_minus_timestamps(tmp_path):  # E6
    data = make_data(tmp_path / "d")
    run(config(data, tmp_path / "a", seed=3))
    run(config(data, tmp_path / "b", seed=3), FakeBackend(delay_s=0.001))
    a = (tmp_path / "a" / "predictions.jsonl").read_bytes()
    b = (tmp_path / "b" / "predictions.jsonl").read_bytes()
    assert a != b  # the timings differ...
    strip = lambda raw: b"".join(records_mod.dumps({k: v for k, v in json.loads(x).items() if k != "timing"})  # noqa: E731
                                 for x in raw.splitlines())
    assert strip(a) == strip(b)  # ...and nothing else, byte for byte


def test_transient_failures_are_retried_with_backoff_and_all_items_end_ok(tmp_path):  # E4
    data = make_data(tmp_path / "d", n=20)
    sleeps = []
    backend = FakeBackend(fail_rate=0.3, seed=5)
    summary = run(config(data, tmp_path / "o", retries=6, backoff_s=0.5), backend, sleep=sleeps.append)
    recs = predictions(tmp_path / "o")
    assert all(r["status"] == "ok" for r in recs) and summary["counts"]["ok"] == 20
    retries = sum(r["retries"] for r in recs)
    assert retries == len(sleeps) == summary["run"]["retries"] > 0
    assert set(sleeps) <= {0.5 * 2 ** k for k in range(6)} and 1.0 in sleeps  # exponential backoff
    clean = run(config(data, tmp_path / "clean"))
    assert stable(summary)["scores"] == stable(clean)["scores"]


def test_deterministic_errors_are_not_retried_and_retriable_ones_are_redone_on_resume(tmp_path):
    data = make_data(tmp_path / "d", n=4, special={1: "Q1 BADINPUT", 2: "Q2 FLAKY ANSWER=a2"})
    backend = FakeBackend(flaky_failures=3)
    summary = run(config(data, tmp_path / "o", retries=1, backoff_s=0), backend)
    by_id = {r["id"]: r for r in predictions(tmp_path / "o")}
    assert by_id["q1"]["status"] == "error" and by_id["q1"]["error_class"] == "corrupt_media"
    assert by_id["q1"]["retriable"] is False and by_id["q1"]["retries"] == 0
    assert by_id["q2"]["status"] == "error" and by_id["q2"]["error_class"] == "transient"
    assert by_id["q2"]["retriable"] is True and by_id["q2"]["retries"] == 1
    assert summary["counts"]["error"] == 2 and summary["scores"]["errors_by_class"] == {"corrupt_media": 1,
                                                                                       "transient": 1}
    # resume: the input error stays, the flaky item is redone (attempt 2) and now succeeds
    backend2 = FakeBackend(flaky_failures=0)
    summary2 = run(config(data, tmp_path / "o", resume=True), backend2)
    assert dict(backend2.items) == {"Q2 FLAKY ANSWER=a2": 1}
    q2 = {r["id"]: r for r in predictions(tmp_path / "o")}["q2"]
    assert q2["status"] == "ok" and q2["attempt"] == 2 and summary2["counts"]["error"] == 1
    assert summary2["scores"]["score"] > summary["scores"]["score"]


def test_retriable_failures_stop_after_max_attempts(tmp_path):
    data = make_data(tmp_path / "d", n=2, special={0: "Q0 FLAKY"})
    for attempt in (1, 2, 3):
        run(config(data, tmp_path / "o", retries=0, max_attempts=2, resume=attempt > 1),
            FakeBackend(flaky_failures=99))
    q0 = [r for r in log_records(tmp_path / "o") if r["id"] == "q0"]
    assert [r["attempt"] for r in q0] == [1, 2]  # the third run left it alone


def test_a_failing_batch_is_redone_item_by_item(tmp_path):
    data = make_data(tmp_path / "d", n=6, special={2: "Q2 BADINPUT"})
    backend = FakeBackend()
    summary = run(config(data, tmp_path / "o", batch_size=4), backend)
    assert backend.batches == [4, 1, 1, 1, 1, 2] and summary["run"]["batch_splits"] == 1
    statuses = [r["status"] for r in predictions(tmp_path / "o")]
    assert statuses == ["ok", "ok", "error", "ok", "ok", "ok"]
    single = run(config(data, tmp_path / "one"))
    assert without_timing(predictions(tmp_path / "o")) == without_timing(predictions(tmp_path / "one"))
    assert stable(summary) == stable(single)


def test_options_left_at_none_keep_earlier_fingerprints():
    """A run made before an option existed keeps its fingerprint (and its records on --resume) when the option is
    added with a None default: the payload of such a run, written out by hand, hashes to the same value."""
    import hashlib

    from eval.backend import GenerationSettings
    from eval.fingerprint import RECORD_FORMAT, fingerprint
    from eval.tasks import get_task

    task = get_task("synthetic_docs")
    settings = GenerationSettings(max_new_tokens=8, max_num_tiles=12, video_pruning_rate=0.0)
    earlier = {"max_new_tokens": 8, "thinking": False, "max_num_tiles": 12, "fps": 2.0, "max_frames": 128,
               "video_pruning_rate": 0.0, "skip_blank_tiles": False, "token_pruning_rate": 0.0, "seed": 0}
    model = {k: FACTS.get(k) for k in ("path", "weights_digest", "config_digest", "files_digest", "precision")}
    payload = {"format": RECORD_FORMAT, "model": model, "device_type": "cpu",
               "task": {"name": task.name, "pre_prompt": task.pre_prompt, "post_prompt": task.post_prompt},
               "generation": {**earlier, "temperature": 0.0}}
    by_hand = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    assert fingerprint(task, FACTS, settings, "cpu") == by_hand
    assert fingerprint(task, FACTS, dataclasses.replace(settings, fps=1.0), "cpu") != by_hand


@pytest.mark.parametrize("change", ["max_new_tokens", "thinking", "video_pruning_rate", "max_num_tiles", "fps",
                                    "weights", "item"])
def test_a_changed_fingerprint_or_item_never_reuses_records(tmp_path, change):  # E5
    data = make_data(tmp_path / "d")
    first = run(config(data, tmp_path / "o"))
    cfg, facts = config(data, tmp_path / "o", resume=True), FACTS
    if change == "weights":
        facts = {**FACTS, "weights_digest": "w1"}
    elif change == "item":
        data = make_data(tmp_path / "d", special={4: "Q4 changed ANSWER=a4"})
    else:
        new = {"max_new_tokens": 7, "thinking": True, "video_pruning_rate": 0.5, "max_num_tiles": 2, "fps": 1.0}[change]
        cfg = dataclasses.replace(cfg, **{change: new})
    backend = FakeBackend()
    second = run(cfg, backend, facts=facts)
    recs = predictions(tmp_path / "o")
    if change == "item":
        assert dict(backend.items) == {"Q4 changed ANSWER=a4": 1}
        assert second["header"]["fingerprint"] == first["header"]["fingerprint"]
    else:
        assert sum(backend.items.values()) == N
        assert second["header"]["fingerprint"] != first["header"]["fingerprint"]
        assert {r["fingerprint"] for r in recs} == {second["header"]["fingerprint"]}
    assert len(recs) == N and len(log_records(tmp_path / "o")) == N + (1 if change == "item" else N)


def test_disk_full_stops_cleanly_keeps_records_and_resumes(tmp_path, monkeypatch):  # E7
    data = make_data(tmp_path / "d")
    reference = run(config(data, tmp_path / "ref"))
    real_write, calls = records_mod._write, []

    def full_disk(fd, data):
        calls.append(1)
        if len(calls) == 4:  # the 4th record: half of it reaches the disk, then ENOSPC
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(records_mod, "_write", full_disk)
    with pytest.raises(RecordsWriteError, match="disk is full.*--resume"):
        run(config(data, tmp_path / "o"))
    log = tmp_path / "o" / "records" / "rank0.jsonl"
    assert log.read_bytes().endswith(b"\n") and len(list(iter_records(log, tolerate_torn_tail=False))) == 3
    monkeypatch.setattr(records_mod, "_write", real_write)
    resumed = run(config(data, tmp_path / "o", resume=True))
    assert stable(resumed) == stable(reference)
    assert without_timing(predictions(tmp_path / "o")) == without_timing(predictions(tmp_path / "ref"))


def test_a_failed_write_leaves_no_partial_record(tmp_path, monkeypatch):
    f = tmp_path / "x.jsonl"
    w = RecordWriter(f)
    monkeypatch.setattr(records_mod, "_write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(RecordsWriteError) as info:
        w.append({"id": "a"})
    assert info.value.code == "records_write_failed" and f.read_bytes() == b""
    w.close()


def test_per_item_timeout_kills_the_worker_and_the_run_goes_on(tmp_path):  # E8
    data = make_data(tmp_path / "d", n=4, special={1: "Q1 HANG"})
    backend = ProcessBackend("runner_fakes:make_fake", {}, item_timeout_s=1.0, grace_s=0.5, load_timeout_s=60)
    try:
        first_pid = backend.info()["pid"]
        summary = run(config(data, tmp_path / "o", item_timeout_s=1.0, batch_size=2), backend)
        by_id = {r["id"]: r for r in predictions(tmp_path / "o")}
        assert by_id["q1"]["status"] == "timeout" and by_id["q1"]["error_class"] == "timeout"
        assert by_id["q1"]["retriable"] is True
        assert [by_id[i]["status"] for i in ("q0", "q2", "q3")] == ["ok"] * 3
        assert summary["counts"]["timeout"] == 1 and backend.restarts == 2  # batch timeout, then q1 alone
        with pytest.raises(ProcessLookupError):
            os.kill(first_pid, 0)  # the hung worker is gone
    finally:
        backend.close()


def test_a_crashing_worker_is_replaced_and_the_crash_recorded(tmp_path):
    data = make_data(tmp_path / "d", n=3, special={0: "Q0 CRASH", 2: "Q2 BADINPUT"})
    backend = ProcessBackend("runner_fakes:make_fake", {}, load_timeout_s=60)
    try:
        summary = run(config(data, tmp_path / "o", retries=1, backoff_s=0), backend)
    finally:
        backend.close()
    by_id = {r["id"]: r for r in predictions(tmp_path / "o")}
    assert by_id["q0"]["status"] == "error" and by_id["q0"]["error_class"] == "worker_crashed"
    assert "worker died (exit status 1)" in by_id["q0"]["error_message"]  # the fake's os._exit(1)
    assert by_id["q0"]["retries"] == 1 and by_id["q0"]["retriable"] is True
    assert by_id["q1"]["status"] == "ok" and summary["run"]["retries"] == 1
    assert by_id["q2"]["error_class"] == "corrupt_media"  # typed errors cross the process boundary intact


def test_url_and_escaping_media_are_recorded_as_errors_without_a_model_call(tmp_path):
    data = make_data(tmp_path / "d", n=3)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[0]["image"], rows[2]["image"] = "https://example.com/x.png", "../../etc/passwd"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    backend = FakeBackend()
    summary = run(config(data, tmp_path / "o"), backend)
    recs = predictions(tmp_path / "o")
    assert [r["status"] for r in recs] == ["error", "ok", "error"]
    assert {recs[0]["error_class"], recs[2]["error_class"]} == {RemoteMediaError.code}
    assert backend.calls == 1 and summary["counts"]["error"] == 2 and summary["counts"]["items"] == 3


def test_an_unscorable_dataset_stops_before_any_generation(tmp_path):
    data = make_data(tmp_path / "d", n=3)
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    del rows[1]["answer"]  # e.g. a submission-only test split
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    backend = FakeBackend()
    with pytest.raises(DatasetFormatError, match="row 1 .*answers"):
        run(config(data, tmp_path / "o"), backend)
    assert backend.calls == 0 and not (tmp_path / "o" / "records").exists()


def test_classify_errors():
    assert classify(CorruptMediaError("x")) == ("error", False, False)
    assert classify(DecodeTimeoutError("x")) == ("timeout", False, True)
    assert classify(OSError(errno.EIO, "io")) == ("error", True, True)
    assert classify(RuntimeError("bug")) == ("error", False, False)


class _ShardDist(Dist):
    def barrier(self):  # ranks run one after the other in this test
        pass


def test_sharded_ranks_merge_to_the_single_process_result(tmp_path):
    data = make_data(tmp_path / "d", n=7)
    single = run(config(data, tmp_path / "one"))
    out = tmp_path / "two"
    backends = [FakeBackend(), FakeBackend()]
    assert run(config(data, out), backends[1], dist=_ShardDist(rank=1, world=2, local_rank=1)) is None
    # resume=True only because rank 1 already ran here; real ranks check the folder before a barrier
    merged = run(config(data, out, resume=True), backends[0], dist=_ShardDist(rank=0, world=2, local_rank=0))
    assert sum(backends[0].items.values()) == 4 and sum(backends[1].items.values()) == 3  # i % 2
    assert sorted(p.name for p in (out / "records").glob("*.jsonl")) == ["rank0.jsonl", "rank1.jsonl"]
    assert stable(merged) == stable(single) and merged["run"]["items_run"] == 7
    assert without_timing(predictions(out)) == without_timing(predictions(tmp_path / "one"))


def test_reasoning_is_stripped_by_the_task_and_kept_raw(tmp_path):
    data = make_data(tmp_path / "d", n=2)
    run(config(data, tmp_path / "o", thinking=True, max_new_tokens=64), FakeBackend(think=True))
    r = predictions(tmp_path / "o")[0]
    assert r["raw"] == "thinking about it</think>a0" and r["prediction"] == "a0"


def test_sweep_writes_table_and_png_plot(tmp_path):
    data = make_data(tmp_path / "d", n=4)
    field, values = parse_sweep("video_pruning_rate=0,0.5,0.75")
    assert field == "video_pruning_rate" and values == [0.0, 0.5, 0.75]
    table = run_sweep(config(data, tmp_path / "s"), field, values, backend=FakeBackend(), facts=FACTS,
                      log=lambda m: None)
    assert [r["vision_tokens_after"] for r in table["rows"]] == [16.0, 8.0, 4.0]
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["rows"][2]["label"] == "0.75"
    assert (tmp_path / "s" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "s" / "video_pruning_rate=0.5" / "summary.json").exists()
    assert "| 0.5 |" in (tmp_path / "s" / "sweep.md").read_text()
    # every setting against the first, on the same 4 items (the stand-in answers alike at every rate)
    changes = [r["change_vs_first"] for r in table["rows"]]
    assert [(c["change"], c["low"], c["high"], c["n"], c["n_differ"]) for c in changes] == [(0.0, 0.0, 0.0, 4, 0)] * 3
    assert "change vs video_pruning_rate=0 [95% CI]" in (tmp_path / "s" / "sweep.md").read_text()
    # the task's categories (synthetic_docs: family) per setting: q0/q2 carry their answer, q1/q3 do not
    assert table["rows"][1]["categories"] == {"family": {"fam0": 0.5, "fam1": 0.0, "fam2": 1.0}}
    assert ("| family | video_pruning_rate=0 | video_pruning_rate=0.5 | video_pruning_rate=0.75 |\n|---|---:|---:|---:|\n"
            "| fam0 | 0.5000 | 0.5000 | 0.5000 |") in (tmp_path / "s" / "sweep.md").read_text()
    for bad in ("bogus=1,2", "fps=", "fps=1,1", "max_tiles=a"):
        with pytest.raises(Exception, match="--sweep"):
            parse_sweep(bad)
    assert parse_sweep("thinking=on,off") == ("thinking", [True, False])


def test_file_digest_samples_large_files_and_sees_changes(tmp_path):
    f = tmp_path / "w.safetensors"
    header = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    f.write_bytes(len(header).to_bytes(8, "little") + header + bytes(300_000))
    small = file_digest(f)
    big = file_digest(f, full_below=1000, chunk=1000)
    assert small.startswith("sha256:") and big.startswith("sampled-sha256:")
    raw = bytearray(f.read_bytes())
    raw[-10] = 1  # inside the last sampled chunk
    f.write_bytes(raw)
    assert file_digest(f, full_below=1000, chunk=1000) != big and file_digest(f) != small


def test_cli_score_subcommand_delegates_and_bad_options_exit_2(tmp_path, capsys):
    data = make_data(tmp_path / "d", n=3)
    summary = run(config(data, tmp_path / "o"))
    assert cli_main(["score", "--task", "synthetic_docs", "--predictions", str(tmp_path / "o" / "predictions.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == summary["scores"]["score"]
    assert cli_main(["--task", "synthetic_docs", "--data", str(data), "--out", str(tmp_path / "x"),
                     "--model", str(tmp_path / "no_model")]) == 2
    assert "error [" in capsys.readouterr().err
    assert cli_main(["--task", "synthetic_docs", "--data", str(data), "--out", str(tmp_path / "x"),
                     "--model", str(tmp_path), "--batch-size", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err
    assert cli_main(["tasks"]) == 0 and "videomme" in capsys.readouterr().out


_ORPHAN_SCRIPT = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
from runner_fakes import FACTS
from eval.backend import ProcessBackend
from eval.data import DatasetFormatError
from eval.runner import RunConfig, Runner
backend = ProcessBackend("runner_fakes:make_fake", {"delay_s": 0.2}, load_timeout_s=60)
print(backend.info()["pid"], flush=True)
Runner(RunConfig(**json.loads(sys.argv[2])), backend=backend, facts=FACTS, log=lambda m: None).run()
"""


def test_a_sigkilled_runner_leaves_no_worker_process_behind(tmp_path):
    data = make_data(tmp_path / "d", n=30)
    cfg = dataclasses.asdict(config(data, tmp_path / "o"))
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, json.dumps(sys.path), json.dumps(cfg)],
                            stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    log = tmp_path / "o" / "records" / "rank0.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and log.read_bytes().count(b"\n") >= 1):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker outlived its SIGKILLed runner by 10 s")
