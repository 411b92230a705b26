"""The predictions log of a run: append-only JSONL, one fsync'd line per finished item.

Why this shape (docs/reliability_policy.md §5): VLMEvalKit rewrites its result pickle in place, so a
kill during the dump can corrupt the very file a resume reads; lmms-eval's response cache appends a
JSONL line and fsyncs before anything else. Here a record is one `write` of a complete line followed by
`fsync`, so after a crash the file holds whole records plus at most one torn last line, which
`repair_tail` cuts off before the writer appends again (the item is simply redone). A failed write
(ENOSPC, EIO) truncates the file back to its previous length and stops the run with a `RecordsWriteError`:
records written so far stay intact and the run is resumable once there is room.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from eval.score import PredictionsFormatError
from vl.errors import VLError


class RecordsWriteError(VLError):
    """The predictions log could not be written (disk full, I/O error): the run stops, nothing is lost."""

    code = "records_write_failed"


def dumps(record: Mapping[str, Any]) -> bytes:
    """Canonical line: sorted keys, so two runs with the same results give the same bytes."""
    return json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False).encode("utf-8") + b"\n"


def _write(fd: int, data: bytes) -> int:
    """One os.write; a module-level seam so tests can simulate a full disk mid-line."""
    return os.write(fd, data)


def repair_tail(path: str | os.PathLike) -> int:
    """Cut a torn last line (no trailing newline) off `path`; returns the number of bytes removed."""
    p = Path(path)
    if not p.exists():
        return 0
    size = p.stat().st_size
    if size == 0:
        return 0
    with open(p, "rb+") as f:
        # scan back from the end for the last newline, 64 KiB at a time
        pos, keep = size, None
        while pos > 0 and keep is None:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            if pos + step == size and chunk.endswith(b"\n"):
                return 0
            i = chunk.rfind(b"\n")
            if i != -1:
                keep = pos + i + 1
        keep = keep or 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


def iter_records(path: str | os.PathLike, tolerate_torn_tail: bool = True) -> Iterator[dict]:
    """Records of one log in file order. A torn last line (another process may be writing it, or a crash
    left it) is skipped; a broken line in the middle is an error naming it."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    if tail and not tolerate_torn_tail:
        raise PredictionsFormatError(f"{path}: the last line is incomplete; resume the run to repair it")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PredictionsFormatError(f"{path}:{lineno}: not a JSON record ({e}); this log was edited or "
                                         "damaged outside the runner; move it away and rerun") from e
        if not isinstance(record, dict):
            raise PredictionsFormatError(f"{path}:{lineno}: expected a JSON object, found {type(record).__name__}")
        yield record


class RecordWriter:
    """Appends records to one log file, durably (write + fsync per record)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired_bytes = repair_tail(self.path)
        created = not self.path.exists()
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created:  # make the new directory entry itself durable
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.written = 0

    def append(self, record: Mapping[str, Any]) -> None:
        data = dumps(record)
        start = os.fstat(self.fd).st_size
        try:
            view = memoryview(data)
            while view:
                n = _write(self.fd, view)
                view = view[n:]
            os.fsync(self.fd)
        except OSError as e:
            try:  # never leave half a record behind; truncation needs no free space
                os.ftruncate(self.fd, start)
                os.fsync(self.fd)
            except OSError:
                pass  # resume's repair_tail handles it
            what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"{e.strerror or e}"
            raise RecordsWriteError(
                f"could not append to {self.path}: {what} (errno {e.errno}); the {self.written} records written "
                "by this run are intact. Free space (or fix the file system) and rerun the same command with "
                "--resume to continue where it stopped") from e
        self.written += 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write a whole file via a temp file + fsync + rename: readers see the old or the new file, never half."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
