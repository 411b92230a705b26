"""A string-only chat template in the style of the one published with NVIDIA-Nemotron-Nano-9B-v2 (written for
these tests, not copied): `<SPECIAL_10>System` / `<SPECIAL_11>User` / `<SPECIAL_11>Assistant` turns, `/think` and
`/no_think` read from system and user messages and removed from them, `<think></think>` opening the answer when
reasoning is off, past answers without their reasoning. Like the published one, it calls string methods on
`content`, so a typed content list makes it fail."""

STRING_ONLY_TEMPLATE = r"""
{%- set ns = namespace(enable_thinking=true) -%}
{%- for message in messages -%}
  {%- set content = message['content'] -%}
  {%- if message['role'] == 'user' or message['role'] == 'system' -%}
    {%- if '/think' in content.replace('</think>', '') -%}{%- set ns.enable_thinking = true -%}
    {%- elif '/no_think' in content -%}{%- set ns.enable_thinking = false -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if messages[0]['role'] != 'system' -%}
  {{- '<SPECIAL_10>System\n' -}}
{%- else -%}
  {{- '<SPECIAL_10>System\n' + messages[0]['content'].replace('/think', '').replace('/no_think', '').strip() -}}
{%- endif -%}
{{- '\n' -}}
{%- set messages = messages[1:] if messages[0]['role'] == 'system' else messages -%}
{%- if messages and messages[-1]['role'] == 'assistant' -%}
  {%- set ns.last = messages[-1]['content'].strip() -%}
  {%- set messages = messages[:-1] -%}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = message['content'] -%}
  {%- if message['role'] == 'user' -%}
    {{- '<SPECIAL_11>User\n' + content.replace('/think', '').replace('/no_think', '').strip() + '\n' -}}
  {%- elif message['role'] == 'assistant' -%}
    {%- if '</think>' in content -%}{%- set content = content.split('</think>')[1] -%}{%- endif -%}
    {{- '<SPECIAL_11>Assistant\n' + content.strip() + '\n<SPECIAL_12>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt or ns.last is defined -%}
  {{- '<SPECIAL_11>Assistant\n' -}}
  {{- '<think>\n' if ns.enable_thinking else '<think></think>' -}}
  {%- if ns.last is defined -%}{{- ns.last -}}{%- endif -%}
{%- endif -%}
"""

# A ChatML template in the style of the Nemotron 3 family (Nano 30B-A3B, Nano Omni), written for these tests from the
# behaviour of the published ones (docs/format.md §8.2): the reasoning mode is the `enable_thinking` variable
# (default on), never a toggle in the messages; the system turn is always written, empty when absent; a past
# assistant turn without reasoning gets an empty `<think></think>`; the generation prompt opens `<think>\n` or writes
# `<think></think>`. Content is taken as a string. Like the published ones it reads `truncate_history_thinking`
# (default on): the reasoning of assistant turns before the last user message is dropped, their answers kept.
NEMOTRON3_TEMPLATE = r"""
{%- set enable_thinking = enable_thinking if enable_thinking is defined else True -%}
{%- set truncate_history_thinking = truncate_history_thinking if truncate_history_thinking is defined else True -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}{%- if message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system_text = '' -%}{%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- set offset = 1 if messages[0]['role'] == 'system' else 0 -%}
{%- for message in rest -%}
  {%- if message['role'] == 'assistant' -%}
    {%- set text = message['content'] if '</think>' in message['content'] else '<think></think>' + message['content'] -%}
    {%- if truncate_history_thinking and loop.index0 + offset < ns.last_user -%}
      {%- set text = '<think></think>' + text.split('</think>')[-1].strip() -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' + text.strip() + '<|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' + ('<think>\n' if enable_thinking else '<think></think>') -}}
{%- endif -%}
"""
