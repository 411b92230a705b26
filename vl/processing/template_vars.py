"""Which extra variables a tokenizer's chat template reads, and handing it those a request sets.

A request may set template variables besides the reasoning mode (the `template_kwargs` option, which servers call
`chat_template_kwargs`): the Nemotron 3 templates read `truncate_history_thinking` (keep or drop the reasoning of
earlier assistant turns), `low_effort` and `reasoning_budget`. As vLLM and transformers do, the variables a
template references without setting them (`jinja2.meta.find_undeclared_variables`) are the ones it is given; a
name it does not read cannot change the prompt, so it is dropped and named in the log instead of refused. The
values were checked when the request was built (vl/options.py `check_template_vars`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import jinja2.meta

log = logging.getLogger("vl.processing")


@functools.lru_cache(maxsize=16)
def template_variables(source: str) -> frozenset[str]:
    """The names `source` reads from outside. Parsed by the environment transformers renders it with (its
    `{% generation %}` tag and loop controls), so a template that renders also parses here."""
    from transformers.utils.chat_template_utils import _compile_jinja_template  # heavy; tokenizers imported it

    environment = _compile_jinja_template(source).environment
    return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source)))


def template_source(tokenizer: Any) -> str | None:
    """The template `apply_chat_template` renders by default (a named set's "default"), or None."""
    try:
        return tokenizer.get_chat_template()
    except (ValueError, AttributeError):  # no template, or a named set without a default
        return None


def variables_for(tokenizer: Any, requested: Mapping | None) -> tuple[dict, str | None]:
    """The requested variables this tokenizer's template reads, and a note naming the others (logged and
    dropped), or None when none was dropped."""
    if not requested:
        return {}, None
    source = template_source(tokenizer)
    reads = template_variables(source) if source else frozenset()
    unread = sorted(set(requested) - reads)
    note = None
    if unread:
        why = "this model's chat template does not read them" if source else "this model has no chat template"
        note = f"chat template variable(s) {', '.join(unread)} ignored: {why}"
        log.info("%s", note)
    return {k: v for k, v in requested.items() if k in reads}, note
