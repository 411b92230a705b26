"""The Chat tab's conversation as files a user keeps: JSON (the messages as the page holds them) and Markdown.

The conversation itself lives in the browser (`ChatInterface(save_history=True)`: the browser's local storage,
so a reload keeps it); these files are for taking it elsewhere. Uploaded files appear by name only: their server
paths are the app's business, not the user's.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


def _parts(content) -> list[dict]:
    """A message's content (str, file dict, list of parts, Gradio component dict) -> [{"type": "text"|"file", ...}]."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, (list, tuple)):
        return [p for c in content for p in _parts(c)]
    if isinstance(content, dict):
        if content.get("type") == "text" or ("text" in content and "file" not in content and "path" not in content):
            return _parts(content.get("text"))
        file = content.get("file", content)
        path = file.get("path") if isinstance(file, dict) else file
        name = (file.get("orig_name") if isinstance(file, dict) else None) or (Path(str(path)).name if path else "")
        return [{"type": "file", "name": name}] if name else []
    return [{"type": "text", "text": str(content)}]


def conversation(history) -> list[dict]:
    out = []
    for m in history or []:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            continue
        entry = {"role": m["role"], "content": _parts(m.get("content"))}
        title = (m.get("metadata") or {}).get("title")
        if title:
            entry["title"] = title  # "Reasoning", "Stats"
        out.append(entry)
    return out


def conversation_markdown(history) -> str:
    lines = []
    for m in conversation(history):
        head = "User" if m["role"] == "user" else "Assistant"
        lines.append(f"**{head}{' · ' + m['title'] if m.get('title') else ''}:**")
        for p in m["content"]:
            lines.append(p["text"] if p["type"] == "text" else f"*(file: {p['name']})*")
        lines.append("")
    return "\n".join(lines)


def export_files(history, folder: str | Path) -> list[str]:
    """Writes conversation.json and conversation.md into a fresh folder under `folder`; returns their paths."""
    out = Path(tempfile.mkdtemp(prefix="chat-export-", dir=folder))
    (out / "conversation.json").write_text(json.dumps(conversation(history), ensure_ascii=False, indent=1),
                                           encoding="utf-8")
    (out / "conversation.md").write_text(conversation_markdown(history), encoding="utf-8")
    return [str(out / "conversation.json"), str(out / "conversation.md")]
