"""`vl eval --backend openai` against `vl serve` on the demo model: the same predictions and score as the local
backend on the held-out synthetic files, and a run that stops after the server was killed (3 unanswered items in a
row) and resumes once it is restarted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import DEMO, REPO, free_port, start_serve, stop, wait_health

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")


def vl_eval(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "vl.cli", "eval", "--no-progress", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def predictions(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return {r["id"]: (r["status"], r["prediction"]) for r in rows}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from data_recipes.synthetic.export import export_split

    d = tmp_path_factory.mktemp("heldout")
    tile = json.loads((DEMO / "config.json").read_text())["force_image_size"]
    return {"synthetic_docs": export_split("document", "test", 6, d / "docs", tile_size=tile),
            "synthetic_video": export_split("video", "test", 3, d / "video", tile_size=tile, num_frames=8, fps=2.0)}


def run_in_process(**cfg) -> dict:
    from eval.runner import RunConfig, Runner

    return Runner(RunConfig(progress=False, **cfg)).run()


def test_remote_backend_equals_local_and_resumes_after_a_server_restart(tmp_path, datasets, monkeypatch):
    """Local references and most remote runs go through the runner in this process (no interpreter start-up);
    the command line is exercised by the first remote run and by the resume."""
    import threading

    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    log = tmp_path / "serve.log"
    server = start_serve(port, log_path=log)
    try:
        for task, data in datasets.items():
            run_in_process(task=task, data=str(data), out=str(tmp_path / task / "local"), model=str(DEMO),
                           isolation="inline")
        wait_health(base[:-3], server)
        for task, data in datasets.items():
            out = tmp_path / task / "remote"
            if task == "synthetic_docs":
                remote = vl_eval("--task", task, "--data", str(data), "--out", str(out), "--backend", "openai",
                                 "--base-url", base, "--concurrency", "3")
                assert remote.returncode == 0, remote.stderr[-2000:]
            else:
                run_in_process(task=task, data=str(data), out=str(out), backend="openai", base_url=base,
                               concurrency=3, batch_size=3)
            want, got = predictions(tmp_path / task / "local"), predictions(out)
            assert got == want and all(status == "ok" for status, _ in got.values())
            s_local, s_remote = summary(tmp_path / task / "local"), summary(out)
            assert s_remote["scores"]["score"] == s_local["scores"]["score"]
            assert s_remote["header"]["remote"] == {"base_url": base, "model": "demo"}
            assert s_remote["header"]["fingerprint"] != s_local["header"]["fingerprint"]
            assert s_remote["tokens"]["vision_after"] == s_local["tokens"]["vision_after"]  # our server reports it

        # kill the server mid-run (right after its second answer, so the point is the same on any machine), then
        # restart it and resume
        import vl.server.client

        task, data = "synthetic_docs", datasets["synthetic_docs"]
        out = tmp_path / "interrupted"
        records = out / "records" / "rank0.jsonl"
        answered, real_chat = [], vl.server.client.RemoteEngine.chat

        def chat_then_kill(self, *args, **kwargs):
            result = real_chat(self, *args, **kwargs)
            answered.append(1)
            if len(answered) == 2:
                stop(server)
            return result

        monkeypatch.setattr(vl.server.client.RemoteEngine, "chat", chat_then_kill)
        worker = threading.Thread(target=run_in_process, kwargs=dict(
            task=task, data=str(data), out=str(out), backend="openai", base_url=base, concurrency=1, batch_size=1,
            retries=0))
        worker.start()
        worker.join(300)
        monkeypatch.setattr(vl.server.client.RemoteEngine, "chat", real_chat)
        first, run = summary(out)["counts"], summary(out)["run"]
        # the items after the kill are `unavailable`; after 3 in a row the run stops and leaves the rest unrun
        assert 2 <= first["ok"] < 6 and first["error"] == first["unavailable"] == min(3, 6 - first["ok"]), first
        assert first["missing"] == 6 - first["ok"] - first["error"] and (run["stopped"] is not None) == (
            first["error"] == 3), run
        failed = [json.loads(line) for line in records.read_text().splitlines()]
        assert all(r["retriable"] and r["error_class"] == "unavailable" for r in failed if r["status"] != "ok")

        server = start_serve(port, log_path=log)  # same address, same model: the same run
        wait_health(base[:-3], server)
        resumed = vl_eval("--task", task, "--data", str(data), "--out", str(out), "--backend", "openai",
                          "--base-url", base, "--concurrency", "1", "--resume")
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert f"{first['ok']} done, {6 - first['ok']} to run" in resumed.stderr
        assert predictions(out) == predictions(tmp_path / "synthetic_docs" / "local")
        assert summary(out)["scores"]["score"] == summary(tmp_path / task / "local")["scores"]["score"]
    finally:
        stop(server)
