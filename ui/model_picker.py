"""The model picker: `vl app --model DIR`, where DIR is a folder of checkpoints, serves one at a time and lets the
user switch.

The folder is read by `vl.directory.checkpoint_choices` (config.json fields, never folder names). A switch runs in
the model's queue slot (`ui.controls.MODEL`), so no request runs while models change, and goes in numbered steps,
shown as Gradio progress and on the console like `vl app`'s start-up: [1/2] the current model is freed (after any
request still holding it), [2/2] the chosen one is loaded. Freeing first keeps peak memory at one model, which
matters when each is 12B parameters. A checkpoint that fails to load is reported in the picker's status and the
previous model is loaded again, so the app keeps answering; the picker stays usable either way. The header then
names the model being served and says whether it is the demo model, and what the tabs offer follows what it can do
(`follow_served_model`: upload filters, sound switches, tiling controls). See docs/app_and_cli.md, "Model picker".
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from vl.runtime.cpu.heap import trim_heap
from ui.steps import Step
from vl.errors import VLError


@dataclass
class ModelChoices:
    """The checkpoints offered (name shown -> directory), which one is served, and how one is loaded."""

    paths: dict[str, Path]
    current: str
    load: Callable[[Path], object]  # directory -> ui.runner.UIEngine
    is_demo: Callable[[Path], bool]

    @classmethod
    def from_found(cls, found: list[tuple[Path, str]], load, is_demo) -> ModelChoices:
        """`found` as `checkpoint_choices` gives it; the first vision-language checkpoint is served first (the
        tabs are built for it), else the first one."""
        paths = {p.name: p for p, _ in found}
        first = next((p.name for p, kind in found if kind == "nano_vl_v2"), found[0][0].name)
        return cls(paths, first, load, is_demo)


def _free(ctx) -> None:
    """Drop the app's only reference to the engine, once no request holds it, and give its memory back."""
    old, ctx.engine = ctx.engine, None
    if old is None:
        return
    lock = getattr(old, "_lock", None)
    if lock is not None:
        with lock:  # a request that still runs (concurrency > 1) finishes first
            pass
    del old, lock
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


def switch_model(ctx, choices: ModelChoices, name: str, progress=None) -> tuple[bool, str]:
    """Serve the checkpoint `name` instead of the current one; (switched, status text). Never raises for a
    checkpoint that cannot be loaded: the previous one is loaded again and the text says why."""
    if name not in choices.paths:  # the API accepts any JSON; only the listed folders may be loaded
        return False, f"⚠️ `{name}` is not one of the checkpoints offered ({', '.join(choices.paths)})."
    if name == choices.current and ctx.engine is not None:
        return False, f"Serving `{name}`."  # a repeated pick: nothing to do
    previous = choices.current

    def step(i: int, what: str):
        if progress is not None:
            progress((i - 1, 2), desc=f"[{i}/2] {what}", unit="steps")
        return Step(i, 2, what)

    t0 = time.perf_counter()
    with step(1, f"freeing the model `{previous}`"):
        _free(ctx)
    try:
        with step(2, f"loading the model from {choices.paths[name]}"):
            ctx.engine = choices.load(choices.paths[name])
        choices.current = name
        return True, f"Serving `{name}` (loaded in {time.perf_counter() - t0:.1f} s; `{previous}` was freed)."
    except Exception as exc:  # noqa: BLE001 - whatever failed (typed errors, out of memory), serve the previous one
        why = f"{exc} [{exc.code}]" if isinstance(exc, VLError) else f"{type(exc).__name__}: {exc}"
        print(f"vl app: could not load {name}: {why}", file=sys.stderr, flush=True)
    try:
        with Step(1, 1, f"loading the model `{previous}` again"):
            ctx.engine = choices.load(choices.paths[previous])
        choices.current = previous
        return False, f"⚠️ Could not load `{name}`: {why}. Still serving `{previous}`."
    except Exception as exc:  # noqa: BLE001 - e.g. the folder changed under the app
        return False, (f"⚠️ Could not load `{name}`: {why}. Loading `{previous}` again failed too ({exc}): "
                       "no model is loaded; pick one from the list.")


def build_model_picker(blocks: gr.Blocks, ctx, choices: ModelChoices, header: gr.Markdown, warning: gr.Markdown,
                       header_text: Callable[[str], str], concurrency: dict) -> list:
    """The dropdown and its status line; a pick switches the model and updates the header and the demo warning.
    Returns the events after which the page shows the served model (a pick, a page load), for `follow_served_model`.

    `.input`, not `.change`: the handler puts the dropdown back on the served model after a failed load, and that
    must not count as a new pick. `concurrency`: the model's queue slot (concurrency_id / concurrency_limit).
    The served model is shared by every browser, so a page that opens (or reloads) after a switch is brought up to
    date when it loads: its header and dropdown were built with the first model."""
    with gr.Row(elem_id="model-row"):
        picker = gr.Dropdown(list(choices.paths), value=choices.current, label="Model",
                             info=f"{len(choices.paths)} checkpoints in this folder; picking one frees the current "
                                  "one and loads it", interactive=True, elem_id="model-picker", scale=1)
        status = gr.Markdown(f"Serving `{choices.current}`.", label="Status", elem_id="model-status")

    def shown(text: str):
        served = choices.current
        return (gr.Dropdown(value=served), text, header_text(served),
                gr.Markdown(visible=ctx.engine is not None and choices.is_demo(choices.paths[served])))

    def on_pick(name, progress=gr.Progress()):
        return shown(switch_model(ctx, choices, str(name), progress)[1])

    outputs = [picker, status, header, warning]
    return [picker.input(on_pick, picker, outputs, api_name="model", **concurrency),
            blocks.load(lambda: shown(f"Serving `{choices.current}`."), None, outputs, queue=False,
                        api_visibility="private")]


# the follower components' new properties, as the front end applies an update that a handler returns
_APPLY_PROPS_JS = "(props) => (props || []).map((p) => ({...(p || {}), __type__: 'update'}))"


def follow_served_model(ctx, events: list) -> None:
    """After each of `events`, set the properties of `ctx.followers` from the model now served (`props(ctx)` each).

    They are set in the browser only; the server asks the served model on each request instead (`ui.hearing.
    check_hears`, the processor; the Document tab's server-side type check is `ui.documents.DOCUMENT_TYPES`, what
    any model takes). A component updated through the server is rebuilt per session from its constructor
    arguments (Gradio 6.31 `Blocks.postprocess_data`), which would drop what ui/chat.py and ui/documents.py set on
    the instances (`accept_any_file_type`, `without_stray_temp_files`): a chat upload of another type would raise
    before the chat runs and leave the message box disabled, and each document upload would leave a stray file
    again. So the handler writes the properties into a hidden JSON component and a browser-side step applies
    them. A page opened before a switch by another browser keeps its filters until it reloads or switches."""
    if not ctx.followers:
        return
    components = [c for c, _ in ctx.followers]
    props = gr.JSON(visible=False, elem_id="served-model-props")

    def current() -> list[dict]:
        if ctx.engine is None:  # no model loaded (both loads failed): leave the page as it is
            return [{} for _ in ctx.followers]
        return [fn(ctx) for _, fn in ctx.followers]

    for event in events:
        event.then(current, None, props, queue=False, api_visibility="private").then(
            None, props, components, js=_APPLY_PROPS_JS, queue=False, api_visibility="private")
