"""A deployment's chat template defaults: `vl serve --default-chat-template-kwargs JSON`, spelled as vLLM spells it.

Light on purpose (no torch): `vl serve` checks the flag before any model loads, and `vl serve --help` stays quick.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vl.errors import GenerationOptionError
from vl.options import RequestOptions, spec
from vl.processing.chat import toggle_in_messages


@dataclass(frozen=True)
class TemplateDefaults:
    """A deployment's chat template defaults (`vl serve --default-chat-template-kwargs JSON`, vLLM's flag):
    `thinking` is its `enable_thinking` (the reasoning mode of a request that sets none: no option, no
    `reasoning_effort`, no /think or /no_think in its messages), `variables` the rest, under which a request's own
    `chat_template_kwargs` are merged (the request's value wins)."""

    thinking: bool | None = None
    variables: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str, label: str = "--default-chat-template-kwargs") -> "TemplateDefaults":
        try:
            value = json.loads(text)
        except ValueError as e:
            raise GenerationOptionError(f"{label} must be a JSON object, e.g. '{{\"enable_thinking\": false}}': "
                                        f"{e}") from None
        if not isinstance(value, dict):
            raise GenerationOptionError(f"{label} must be a JSON object, found {type(value).__name__}")
        variables = dict(value)
        thinking = variables.pop("enable_thinking", None)
        thinking = spec("thinking").check(thinking, f"{label} enable_thinking")
        return cls(thinking, spec("template_kwargs").check(variables, label) if variables else {})

    def apply(self, options: RequestOptions, messages) -> RequestOptions:
        changes = {}
        if self.variables:
            changes["template_kwargs"] = {**self.variables, **(options.template_kwargs or {})}
        if self.thinking is not None and options.thinking is None and toggle_in_messages(messages) is None:
            changes["thinking"] = self.thinking
        return options.replace(**changes) if changes else options
