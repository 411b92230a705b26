"""Generation controls shared by the three tabs, and the pieces every tab's handler needs.

One set of widgets (reasoning toggle, reasoning budget, max new tokens, temperature) sits above the tabs and
feeds every handler, so a setting means the same thing everywhere. Slider values are re-checked on the server:
the HTTP API accepts any JSON, not only what a slider can produce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from ui.hearing import hears
from ui.limits import AppLimits, check_float, check_option
from ui.runner import GenOptions

MODEL = "model"  # the one concurrency group: every event that runs the engine shares its slot(s)


@dataclass
class AppContext:
    """What the tab builders need: the engine, the limits and the folders files may come from.

    `followers`: the components whose properties come from what the served model can do (upload filters, the sound
    switches, the tiling controls), each with the function that gives them (`follow`); the model picker sets them
    again after a switch (ui/model_picker.py `follow_served_model`)."""

    engine: object  # ui.runner.UIEngine; None while the model picker has no model loaded
    limits: AppLimits
    media_roots: list[Path]  # the upload folder and the bundled examples
    followers: list[tuple[object, Callable[[AppContext], dict]]] = field(default_factory=list)

    def follow(self, component, props: Callable[[AppContext], dict]):
        """`component` (built with `**props(self)`), its properties `props(ctx)` set again whenever the served model
        changes; returns `component`."""
        self.followers.append((component, props))
        return component

    @property
    def config(self):
        return self.engine.model.config

    @property
    def tiled(self) -> bool:
        """The model reads images as tiles of its tile size (Nano V2 VL: the tiling, PDF and token-reduction
        controls apply); Nemotron 3 Nano Omni reads them at their own resolution and takes no PDF."""
        return hasattr(self.config, "tokens_per_tile")

    @property
    def hears(self) -> bool:
        return hears(self.engine)


def shown_if_tiled(ctx: AppContext) -> dict:
    """A Nano V2 VL control (tiling, PDF pages, token reduction): shown while the served model reads tiles."""
    return {"visible": ctx.tiled}


@dataclass
class Controls:
    thinking: gr.Checkbox
    reasoning_budget: gr.Slider
    max_new_tokens: gr.Slider
    temperature: gr.Slider

    @property
    def inputs(self) -> list:
        return [self.thinking, self.reasoning_budget, self.max_new_tokens, self.temperature]


def build_controls(limits: AppLimits) -> Controls:
    with gr.Accordion("Generation settings (all tabs)", open=False, elem_id="settings"):
        with gr.Row():
            thinking = gr.Checkbox(value=False, label="Reasoning (/think)",
                                   info="on: the model thinks first, shown in a collapsible section; off: /no_think")
            budget = gr.Slider(0, limits.max_reasoning_budget, value=0, step=16, label="Reasoning budget (tokens)",
                               info="0 = no budget; otherwise the think block is closed after this many tokens")
            max_new = gr.Slider(1, limits.max_new_tokens, value=min(256, limits.max_new_tokens), step=1,
                                label="Max new tokens", elem_id="max-new-tokens")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature", info="0 = greedy")
    return Controls(thinking, budget, max_new, temperature)


def gen_options(limits: AppLimits, thinking, reasoning_budget, max_new_tokens, temperature) -> GenOptions:
    budget = check_option("reasoning budget", "reasoning_budget", reasoning_budget or 0, limits.max_reasoning_budget)
    return GenOptions(thinking=bool(thinking), reasoning_budget=budget or None,
                      max_new_tokens=check_option("max new tokens", "max_new_tokens", max_new_tokens,
                                                  limits.max_new_tokens),
                      temperature=check_float("temperature", temperature, 0.0, 2.0))



def file_example(name: str) -> dict:
    """A local file as "Use via API" shows it (`handle_file(name)`), instead of Gradio's sample URLs, which this
    app refuses (it never fetches remote media)."""
    return {"path": name, "meta": {"_type": "gradio.FileData"}, "orig_name": name}


def api_example(component, value):
    """`component` with `value` as its sample in "Use via API" (Gradio shows "Hello!!" for every textbox).

    An instance attribute, not a subclass: Gradio's component metaclass writes a `.pyi` stub next to the module
    of every component subclass."""
    component.example_payload = component.example_value = lambda: value
    return component
