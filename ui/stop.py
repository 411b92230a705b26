"""The Stop button: ends the work at the next safe point, says "stopped", and is inactive when nothing runs.

Gradio's `cancels=` alone cancels the event's task, but the thread in which the handler runs goes on until it
next yields, and before the first token there is no yield: a stopped PDF request used to render and encode every
page to the end (the next request then reported those pages as vision-cache hits), and the status kept saying
"generating…". So each browser session holds a `StopFlag` (a `gr.State`: one per session, never shared between
users); the handler passes its event to `vl.Engine.chat(cancel=...)`, which checks it between pages, tiles and
tokens and kills a decode worker that is running (vl/processing/progress.py). The Stop click sets the flag and
writes "stopped" at once; the handler then ends at the next safe point and shows its stats, "finished by:
stopped".
"""

from __future__ import annotations

import threading

import gradio as gr

from ui.limits import user_error

STOPPED_TEXT = "*stopped*"
FAILED_TEXT = "**Error**: the request failed (see the notice)"  # when the handler failed without `failed`


class StopFlag:
    """A per-session stop event. `gr.State` deep-copies its default for each session: each gets its own."""

    def __init__(self):
        self.event = threading.Event()
        self.failure: str | None = None  # the request's error, for the status once its notice fades (`failed`)

    def __deepcopy__(self, memo):
        return StopFlag()

    def start(self) -> threading.Event:
        """A new request begins: a fresh event (a stop of the previous request must not stop this one)."""
        self.event = threading.Event()
        self.failure = None
        return self.event

    def stop(self) -> None:
        self.event.set()


def failed(flag, exc: BaseException, where: str) -> gr.Error:
    """The `gr.Error` to raise for `exc` (a notice in the page, an error for API callers), also kept on the
    session's flag, so that `run_with_stop`'s failure step writes it into the tab's status: the notice fades after
    a while, the status keeps saying what went wrong."""
    error = user_error(exc, where=where)
    if isinstance(flag, StopFlag):
        flag.failure = f"**{error.title}:** {error.message}"  # escaped by `user_error`
    return error


def stop_state() -> gr.State:
    return gr.State(StopFlag())


# on a narrow screen the answer is below the inputs, out of sight: bring it into view when the question is asked
SCROLL_JS = """() => {{ if (window.innerWidth < 768) {{
    const el = document.querySelector('#{}'); if (el) el.scrollIntoView({{block: 'start'}}); }} }}"""


def run_with_stop(trigger, stop: gr.Button, flag: gr.State, fn, inputs, outputs, scroll_to: str | None = None,
                  status=None, **kwargs):
    """`trigger(fn, inputs, outputs, **kwargs)` with Stop active while it runs; returns the event of `fn`.

    A chain: (clear the session's flag, activate Stop) -> fn -> deactivate Stop. The flag is cleared at the click,
    not when `fn` starts, so that a Stop pressed while the request still waits in the queue ends it as soon as it
    starts. `scroll_to`: the elem_id brought into view on narrow screens when it starts (the answer). (A second
    listener on the same trigger did not reliably update the button in Gradio 6.31, hence the chain.)

    When `fn` fails (it raised `failed(...)`), Gradio 6.31 runs no `.then` step after it, only `.failure` ones:
    that step deactivates Stop and writes the error into `status` (one of `outputs`), in place of the stage text
    ("reading the document…"); every output gets an update, which clears Gradio's red "Error" badges."""
    def begin(f):
        if isinstance(f, StopFlag):
            f.start()
        return gr.Button(interactive=True)

    started = trigger(begin, flag, stop, queue=False, api_visibility="private")
    if scroll_to:  # a step of its own: a `js` next to a Python function would replace that function's inputs
        started = started.then(None, None, None, js=SCROLL_JS.format(scroll_to), api_visibility="private")
    event = started.then(fn, inputs, outputs, **kwargs)
    event.then(lambda: gr.Button(interactive=False), None, stop, queue=False, api_visibility="private")
    if status is not None:
        def show_failure(f):
            text = f.failure if isinstance(f, StopFlag) and f.failure else FAILED_TEXT
            return [gr.Button(interactive=False)] + [text if o is status else gr.skip() for o in outputs]

        event.failure(show_failure, flag, [stop] + list(outputs), queue=False, api_visibility="private")
    return event


def wire_stop(stop: gr.Button, flag: gr.State, status) -> None:
    """Stop: set the session's flag and show "stopped" in `status` at once; the running handler ends at its next
    safe point and writes its final status ("finished by: stopped") itself.

    No `cancels=`: Gradio's cancel raced the handler's last updates (the page showed "Error" over the status, or
    "generating…" after "stopped"), and a cancelled handler cannot say what it did."""

    def on_stop(f: StopFlag):
        if isinstance(f, StopFlag):
            f.stop()
        return STOPPED_TEXT, gr.Button(interactive=False)

    stop.click(on_stop, flag, [status, stop], queue=False, api_visibility="private")
