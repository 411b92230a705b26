"""The model picker (`vl app --model FOLDER`): the folder is read by config.json fields, a switch frees the old model
and serves the new one (header updated, demo warning shown only for the demo model), and a checkpoint that cannot
load is reported while the app keeps serving the previous model.

gradio_client against the app in-process over `checkpoints_folder` (conftest), compared with a plain `vl.Engine`
over the same checkpoints; the browser side is in test_ui_browser.py.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from ui_helpers import document_args, run_streamed

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def picker(picker_served):
    return Client(picker_served.url, verbose=False, download_files=False)


def _pick(client, name: str):
    """(dropdown value, status text, header text, demo warning shown) after picking `name`."""
    value, status, header, warning = client.predict(name, api_name="/model")
    shown = warning.get("visible", True) if isinstance(warning, dict) else True
    return (value.get("value") if isinstance(value, dict) else value), status, header, shown


def test_folder_of_checkpoints_is_read_by_config_fields(checkpoints_folder, tiny_dir):
    from vl.directory import checkpoint_choices

    found, skipped = checkpoint_choices(checkpoints_folder)
    names = [p.name for p, _ in found]
    assert names[:3] == ["alpha", "beta", "broken"] and "notes" not in names and "stray" not in names
    assert {kind for _, kind in found} == {"nano_vl_v2"}
    assert [p.name for p, _ in skipped] == ["stray"] and "llama" in skipped[0][1]
    assert checkpoint_choices(tiny_dir) == ([(Path(tiny_dir), "nano_vl_v2")], [])  # one checkpoint: itself


def test_one_checkpoint_has_no_picker(tiny_dir, tmp_path):
    from ui.app import _model_choices

    assert _model_choices(tiny_dir, None) == (Path(tiny_dir), None)
    (tmp_path / "only").symlink_to(tiny_dir, target_is_directory=True)
    assert _model_choices(tmp_path, None) == (tmp_path / "only", None)  # a folder holding one: that one


def test_switching_serves_the_new_model_and_frees_the_old(picker, picker_served, examples, checkpoints_folder):
    import vl

    _pick(picker, "alpha")
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(".png"))
    messages = [{"role": "user", "content": [{"type": "image", "image": ex["path"]},
                                             {"type": "text", "text": ex["question"]}]}]
    value, status, header, warning = _pick(picker, "beta")
    assert value == "beta" and "Serving `beta`" in status and "`alpha` was freed" in status, status
    assert "Model: `beta`" in header and not warning
    _, final, _, _ = run_streamed(picker, "/document", document_args([handle_file(ex["path"])], ex["question"],
                                                                      max_new_tokens=6))
    want = {name: vl.Engine.from_pretrained(checkpoints_folder / name).chat(messages, max_new_tokens=6,
                                                                            thinking=False).answer
            for name in ("alpha", "beta")}
    assert want["alpha"] != want["beta"] and final[1] == want["beta"], (final[1], want)
    gc.collect()
    alive = [name for name, ref in picker_served.loaded if ref() is not None]
    assert alive == ["beta"], f"engines still in memory after the switch: {alive}"

    _pick(picker, "alpha")
    _, final, _, _ = run_streamed(picker, "/document", document_args([handle_file(ex["path"])], ex["question"],
                                                                      max_new_tokens=6))
    assert final[1] == want["alpha"]


def test_demo_model_is_named_as_such(picker, picker_served):
    if "demo" not in picker_served.models.paths:
        pytest.skip("the demo model (vl/demo) is not trained yet; vl train-demo makes it")
    value, _, header, warning = _pick(picker, "demo")
    assert value == "demo" and "Model: `demo`" in header and warning
    _, _, header, warning = _pick(picker, "alpha")
    assert "Model: `alpha`" in header and not warning


def test_a_checkpoint_that_cannot_load_is_reported_and_the_app_keeps_serving(picker, picker_served, examples):
    _pick(picker, "alpha")
    value, status, header, _ = _pick(picker, "broken")
    assert value == "alpha" and "Could not load `broken`" in status and "Still serving `alpha`" in status, status
    assert "safetensors" in status and "[bad_checkpoint]" in status and "Model: `alpha`" in header
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(".png"))
    _, final, _, _ = run_streamed(picker, "/document", document_args([handle_file(ex["path"])], ex["question"],
                                                                      max_new_tokens=4))
    assert final[1] and "finished by" in final[3]
    try:  # only the listed folders: a path is refused by Gradio's choice check or by the picker itself
        _, status, header, _ = _pick(picker, str(Path(examples.dir)))
        assert "not one of the checkpoints offered" in status and "Model: `alpha`" in header
    except AppError:
        pass
    assert picker_served.models.current == "alpha"


def test_switch_shows_numbered_steps_as_progress(picker, picker_served):
    _pick(picker, "alpha")
    picker_served.load_delay_s = 1.0  # a model that takes a second to load
    try:
        job = picker.submit("beta", api_name="/model")
        seen, t0 = set(), time.perf_counter()
        while not job.done():
            assert time.perf_counter() - t0 < 60
            for p in job.status().progress_data or []:
                seen.add((p.desc, p.index, p.length))
            time.sleep(0.01)
    finally:
        picker_served.load_delay_s = 0.0
    assert "Serving `beta`" in job.result()[1]
    assert any(d.startswith("[2/2] loading the model from") and i == 1 and n == 2 for d, i, n in seen), seen


def test_picker_endpoint_has_named_parameters(picker):
    import re

    info = picker.view_api(print_info=False, return_format="dict")["named_endpoints"]["/model"]
    params = [(p["parameter_name"], p["label"]) for p in info["parameters"]]
    assert params == [("name", "Model")], params
    labels = [r["label"] for r in info["returns"]]
    assert not [x for x in labels if re.fullmatch(r"(value|parameter)_\d+", x)], labels
