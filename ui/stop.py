"""The Stop button: ends the work at the next safe point, says "stopped", and is inactive when nothing runs.

Gradio's `cancels=` alone cancels the event's task, but the thread in which the handler runs goes on until it
next yields, and before the first token there is no yield: a stopped PDF request used to render and encode every
page to the end (the next request then reported those pages as vision-cache hits). So each browser session holds
a `StopFlag` (a `gr.State`: one per session, never shared between users); the handler passes its event to
`vl.Engine.chat(cancel=...)`, which checks it between pages, tiles and tokens and kills a decode worker that is
running (vl/processing/progress.py). The Stop click sets the flag, cancels the event, and writes "stopped" into
the tab's status, since a cancelled handler cannot write anything any more.
"""

from __future__ import annotations

import threading

import gradio as gr

STOPPED_TEXT = "*stopped*"


class StopFlag:
    """A per-session stop event. `gr.State` deep-copies its default for each session: each gets its own."""

    def __init__(self):
        self.event = threading.Event()

    def __deepcopy__(self, memo):
        return StopFlag()

    def start(self) -> threading.Event:
        """A new request begins: a fresh event (a stop of the previous request must not stop this one)."""
        self.event = threading.Event()
        return self.event

    def stop(self) -> None:
        self.event.set()


def stop_state() -> gr.State:
    return gr.State(StopFlag())


def _active():
    return gr.Button(interactive=True)


def _inactive():
    return gr.Button(interactive=False)


# on a narrow screen the answer is below the inputs, out of sight: bring it into view when the question is asked
SCROLL_JS = """() => {{ if (window.innerWidth < 768) {{
    const el = document.querySelector('#{}'); if (el) el.scrollIntoView({{block: 'start'}}); }} }}"""


def run_with_stop(trigger, stop: gr.Button, fn, inputs, outputs, scroll_to: str | None = None, **kwargs):
    """`trigger(fn, inputs, outputs, **kwargs)` with Stop active while it runs; returns the event of `fn`.
    `scroll_to`: the elem_id brought into view on narrow screens when it starts (the answer).

    A chain (activate -> fn -> deactivate): a second listener on the same trigger did not reliably update the
    button in Gradio 6.31."""
    js = SCROLL_JS.format(scroll_to) if scroll_to else None
    event = trigger(_active, None, stop, queue=False, api_visibility="private", js=js).then(fn, inputs, outputs,
                                                                                           **kwargs)
    event.then(_inactive, None, stop, queue=False, api_visibility="private")
    return event


def wire_stop(stop: gr.Button, flag: gr.State, status, events: list) -> None:
    """Stop: set the session's flag, cancel `events`, show "stopped" in `status`, go inactive.
    `stop` should be built with `interactive=False` and the events made with `run_with_stop`."""

    def on_stop(f: StopFlag):
        if isinstance(f, StopFlag):
            f.stop()
        return STOPPED_TEXT, gr.Button(interactive=False)

    # queued (in Gradio's default group, not the model's): with queue=False the page showed "Error" over the
    # status, or kept "generating…"
    stop.click(on_stop, flag, [status, stop], cancels=events, api_visibility="private")
