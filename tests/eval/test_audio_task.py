"""The synthetic_audio task end to end on a tiny random Nemotron 3 Nano Omni directory: `export_split("audio")`
writes WAV items, the runner answers them through `vl.Engine`, and each record carries the audio tokens the model
heard beside the vision counts; a corrupt WAV among good ones is recorded as that item's error while the others are
scored. Scores are whatever a random model gets: the shape of the records is what is tested."""

import json
from pathlib import Path

import pytest
from tiny_models import make_tiny_omni_dir

from data_recipes.synthetic.export import export_split
from eval.backend import EngineBackend, Generation
from eval.records import iter_records
from eval.runner import RunConfig, Runner, model_facts


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    d, _ = make_tiny_omni_dir(tmp_path_factory.mktemp("eval_omni") / "omni")
    backend = EngineBackend(str(d), decode_sandbox=False)
    yield d, backend
    backend.close()


def test_audio_items_are_answered_with_their_audio_tokens_and_a_corrupt_one_is_its_own_error(omni, tmp_path):
    d, backend = omni
    jsonl = export_split("audio", "test", 4, tmp_path / "data")
    (tmp_path / "data" / "media" / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    broken = {**rows[1], "id": "broken", "content": [{"type": "audio", "audio": "media/broken.wav"}]}
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows[:2] + [broken] + rows[2:]))
    out = tmp_path / "run"
    cfg = RunConfig(task="synthetic_audio", data=str(jsonl), out=str(out), model=str(d), progress=False,
                    isolation="inline", decode_sandbox=False, device="cpu", max_new_tokens=2)
    summary = Runner(cfg, backend=backend, facts=model_facts(str(d)), log=lambda m: None).run()
    records = {r["id"]: r for r in iter_records(out / "predictions.jsonl")}
    assert set(records) == {r["id"] for r in rows} | {"broken"}
    bad = records.pop("broken")
    assert bad["status"] == "error" and bad["error_class"] in ("corrupt_media", "unsupported_format"), bad
    assert bad["tokens"] is None
    for r in records.values():
        assert r["status"] == "ok" and r["family"] in ("audio_beeps", "audio_pitch"), r
        assert set(r["tokens"]) == {"prompt", "vision_before", "vision_after", "audio", "new"}
        assert r["tokens"]["audio"] > 0 and r["tokens"]["vision_before"] == r["tokens"]["vision_after"] == 0
        assert r["tokens"]["prompt"] > r["tokens"]["audio"]
    # longer clips fill more audio placeholders: the counts are the items' own, not one number repeated
    assert len({r["tokens"]["audio"] for r in records.values()}) > 1
    assert summary["counts"]["error"] == 1 and summary["counts"]["ok"] == 4
    assert summary["tokens"]["audio"]["mean"] > 0
    assert set(summary["scores"]["categories"]["family"]) == {"audio_beeps", "audio_pitch"}


def test_remote_records_say_none_when_the_server_does_not_report_audio_tokens():
    """`Generation.audio_tokens` None (a server without usage.audio_tokens) stays None in the summary's tokens."""
    from eval.summary import _token_stats

    ok = {"status": "ok", "timing": {"ttft_s": 0.1}}
    reported = [{**ok, "tokens": {"prompt": 9, "vision_before": 0, "vision_after": 0, "audio": 5, "new": 2}}]
    silent = [{**ok, "tokens": {"prompt": 9, "vision_before": 0, "vision_after": 0, "audio": None, "new": 2}}]
    old = [{**ok, "tokens": {"prompt": 9, "vision_before": 0, "vision_after": 0, "new": 2}}]  # before audio
    assert _token_stats(reported)["audio"]["mean"] == 5
    assert _token_stats(silent)["audio"]["total"] is None
    assert _token_stats(old)["audio"]["total"] == 0
    assert Generation("x", "stop").audio_tokens == 0
