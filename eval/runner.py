"""Batch evaluation runner: dataset items -> generations -> append-only predictions log -> summary.

Follows docs/reliability_policy.md §5 ("Our batch eval") and docs/eval_scoring.md §0:
- Every item ends with one final record keyed by item id, item content hash and a run fingerprint
  (model directory and weights/config/tokenizer digests, precision, device type, task prompt, decoding
  and media/token-reduction settings). Records go to `out/records/rank<R>.jsonl`, one fsync'd line each
  (eval/records.py). A change of any fingerprinted setting, or of the item itself, never reuses a record.
- `resume=True` skips items whose record is ok or a deterministic error, redoes retriable failures
  (up to `max_attempts` runs) and items never finished (a torn last line is cut off first).
- A bad item (bomb image, corrupt video, encrypted PDF, URL media) becomes an `error` record with the
  stable code of its typed error (vl/errors.py); transient failures are retried with exponential backoff;
  an item past its timeout becomes `timeout` (the process backend replaces its worker). The run goes on.
- A batch that fails is redone item by item, so one bad item never costs its batch-mates.
- An item the server never answered (`unavailable`: refused, dropped or stalled connections, gateway errors) is
  not a result about the item: --resume always redoes it (it does not count against `max_attempts`), and after
  `max_connection_failures` such items in a row the run stops, says so, and leaves the rest for --resume.
- Distributed (`accelerate launch -m eval ...`, or any launcher that sets RANK/WORLD_SIZE): item i
  belongs to rank i % world; each rank appends to its own log; after a barrier rank 0 merges the logs
  once into `predictions.jsonl` (dataset order, one record per item) and writes `summary.json` and
  `summary.md` (via temp file + rename). Records carry nothing rank-specific, so one process and two
  give the same files apart from timings.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eval.backend import (
    EVAL_OPTIONS,
    EngineBackend,
    Generation,
    ItemTimeoutError,
    ProcessBackend,
    TransientError,
    WorkerCrashedError,
)
from eval.data import Item
from eval.fingerprint import RECORD_FORMAT, file_digest, fingerprint, item_digest, model_facts
from eval.items import Planned, iter_items, plan_items
from eval.records import RecordsWriteError, RecordWriter, dumps, iter_records, write_atomic
from eval.remote_backend import RemoteBackend, remote_facts
from eval.run_config import RunConfig, RunOptionError, effective_settings
from eval.summary import build_summary, code_versions, summary_markdown
from eval.tasks import get_task
from vl.errors import (
    CheckpointError,
    ConfigError,
    DecoderCrashedError,
    DecodeTimeoutError,
    InputError,
    ServerUnavailableError,
    VLError,
)


class OutputExistsError(InputError):
    code = "output_exists"


# ---------------------------------------------------------------------------------------------------
# distributed


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        """RANK/WORLD_SIZE/LOCAL_RANK as set by `accelerate launch` (torchrun). The barrier is a gloo process
        group with a week-long timeout: ranks finish their shards at different times, and NCCL's default
        10-minute collective timeout would kill a long eval."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        if world > 1:
            import torch.distributed as td

            if not td.is_initialized():
                if not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
                    raise RunOptionError("WORLD_SIZE > 1 but MASTER_ADDR/MASTER_PORT are not set; launch with "
                                         "`accelerate launch -m eval ...` or torchrun")
                td.init_process_group("gloo", timeout=timedelta(days=7))
        return cls(rank, world, local)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as td

            td.barrier()

    @property
    def main(self) -> bool:
        return self.rank == 0


def default_device(device: str | None, local_rank: int) -> str:
    if device not in (None, "auto"):
        return device
    import torch

    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"


def make_backend(cfg: RunConfig, device: str):
    if cfg.backend == "openai":
        return RemoteBackend(cfg.base_url, api_key=cfg.api_key, model=cfg.served_model, concurrency=cfg.concurrency,
                             timeout_s=cfg.read_timeout_s)
    kwargs = {"model": cfg.model, "dtype": cfg.dtype, "device": device, "decode_sandbox": cfg.decode_sandbox}
    if cfg.isolation == "inline":
        return EngineBackend(**kwargs)
    return ProcessBackend("eval.backend:make_engine_backend", kwargs, item_timeout_s=cfg.item_timeout_s)


# ---------------------------------------------------------------------------------------------------
# outcomes


@dataclass
class Outcome:
    status: str  # "ok" | "error" | "timeout"
    generation: Generation | None = None
    error: BaseException | None = None
    retriable: bool = False
    retries: int = 0
    elapsed_s: float = 0.0


def classify(e: BaseException) -> tuple[str, bool, bool]:
    """(status, retry now, retriable later). Input errors are deterministic: never retried. Timeouts are
    not retried in the run (they cost the most) but are redone by --resume. Worker/decoder crashes,
    out-of-memory and I/O errors are retried with backoff. Anything else is a bug for that input."""
    if isinstance(e, (ItemTimeoutError, DecodeTimeoutError)):
        return "timeout", False, True
    if isinstance(e, (InputError, ConfigError, CheckpointError)):
        return "error", False, False
    transient = (TransientError, WorkerCrashedError, DecoderCrashedError, MemoryError, ConnectionError, TimeoutError)
    if isinstance(e, transient) or type(e).__name__ == "OutOfMemoryError" or (
            isinstance(e, OSError) and not isinstance(e, VLError)):
        return "error", True, True
    return "error", False, False


UNANSWERED = ServerUnavailableError.code  # the server never answered: says nothing about the item


def error_code(e: BaseException) -> str:
    if isinstance(e, VLError):
        return e.code
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return "out_of_memory"
    if isinstance(e, OSError):
        return "os_error"
    return "internal_error"


# ---------------------------------------------------------------------------------------------------
# the run


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def final_record(records: list[dict]) -> dict | None:
    """The record that stands for an item: its latest ok record, else its latest attempt."""
    if not records:
        return None
    ok = [r for r in records if r.get("status") == "ok"]
    return max(ok or records, key=lambda r: r.get("attempt", 0))


class Runner:
    """One evaluation of one task with one configuration. `backend`/`facts` are injectable (tests, sweeps)."""

    def __init__(self, cfg: RunConfig, backend=None, facts: dict | None = None, dist: Dist | None = None,
                 log: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep):
        self.cfg, self.dist = cfg, dist or Dist()
        self.task = get_task(cfg.task)
        self.log = log or (_stderr if self.dist.main else (lambda msg: None))
        self.sleep = sleep
        self.device = default_device(cfg.device, self.dist.local_rank)
        if cfg.backend == "openai":  # the model lives behind a URL: its address and id identify it

            self.device = "remote"
            if backend is None:
                backend, self._made_backend = make_backend(cfg, self.device), True
            facts = facts or remote_facts(backend.engine)
        if facts is None:
            if cfg.model is None:
                raise RunOptionError("no model: pass --model PATH (a Nano V2 VL checkpoint directory)")
            facts = model_facts(cfg.model, cfg.dtype)
        self.facts = facts
        self.settings = effective_settings(cfg, self.task, facts)
        self.fingerprint = fingerprint(self.task, facts, self.settings, self.device.split(":")[0])
        self._backend, self._own_backend = backend, backend is None or getattr(self, "_made_backend", False)
        self.out = Path(cfg.out)
        self.records_dir = self.out / "records"
        self.stats = {"items_run": 0, "retries": 0, "batch_splits": 0, "errors": 0}
        self.unanswered_in_a_row, self.stopped = 0, None  # `stopped`: why the run ended early, if it did

    @property
    def backend(self):
        if self._backend is None:
            self._backend = make_backend(self.cfg, self.device)
        return self._backend

    # --- logs ------------------------------------------------------------------------------------
    def _logs(self) -> list[Path]:
        return sorted(self.records_dir.glob("rank*.jsonl")) if self.records_dir.exists() else []

    def _read_all(self) -> list[dict]:
        return [r for path in self._logs() for r in iter_records(path)]

    def _index(self, plan: list[Planned], records: list[dict]) -> tuple[dict[str, list[dict]], int]:
        """Records of this configuration per item id (content hash must match too), and how many records
        were set aside because they belong to another configuration or an older version of the item."""
        digests = {p.id: p.digest for p in plan}
        mine, other = defaultdict(list), 0
        for r in records:
            if r.get("fingerprint") == self.fingerprint and digests.get(str(r.get("id"))) == r.get("content_hash"):
                mine[str(r["id"])].append(r)
            else:
                other += 1
        return mine, other

    def _pending(self, plan: list[Planned], done: dict[str, list[dict]]) -> list[Planned]:
        pending = []
        for p in plan:
            if p.index % self.dist.world != self.dist.rank:
                continue
            recs = done.get(p.id, [])
            if any(r.get("status") == "ok" for r in recs):
                continue
            if recs:
                last = max(recs, key=lambda r: r.get("attempt", 0))
                spent = last.get("attempt", 1) >= self.cfg.max_attempts and last.get("error_class") != UNANSWERED
                if not last.get("retriable") or spent:
                    continue
                p.attempt = last.get("attempt", 1) + 1
            pending.append(p)
        return pending

    # --- generation ------------------------------------------------------------------------------
    def _one(self, conversation) -> Outcome:
        retries = 0
        while True:
            start = time.monotonic()
            try:
                (gen,) = self.backend.generate([conversation], self.settings)
                status = "timeout" if gen.finish_reason == "timeout" else "ok"
                return Outcome(status, gen, retriable=status == "timeout", retries=retries,
                               elapsed_s=time.monotonic() - start)
            except Exception as e:  # noqa: BLE001 - every failure becomes a typed record
                status, retry_now, retriable = classify(e)
                if retry_now and retries < self.cfg.retries:
                    self.sleep(self.cfg.backoff_s * 2 ** retries)
                    retries += 1
                    self.stats["retries"] += 1
                    continue
                return Outcome(status, None, e, retriable, retries, time.monotonic() - start)

    def _batch(self, items: list[Item]) -> list[Outcome]:
        """Outcomes of `items`, in order; fewer than `items` when the run stopped because the server is gone."""
        conversations = [self.task.build_messages(item) for item in items]
        if len(items) > 1:
            start = time.monotonic()
            try:
                gens = self.backend.generate(conversations, self.settings)
            except Exception:  # noqa: BLE001 - redo one by one: the failing item is found and recorded alone
                self.stats["batch_splits"] += 1
            else:
                each = (time.monotonic() - start) / len(items)
                self.unanswered_in_a_row = 0
                return [Outcome("timeout" if g.finish_reason == "timeout" else "ok", g,
                                retriable=g.finish_reason == "timeout", elapsed_s=each) for g in gens]
        outcomes = []
        for item, conversation in zip(items, conversations):
            if self.stopped:
                break
            outcomes.append(self._one(conversation))
            self._count_unanswered(item, outcomes[-1])
        return outcomes

    def _count_unanswered(self, item: Item, outcome: Outcome) -> None:
        """Say each item the server did not answer, and stop the run after `max_connection_failures` in a row:
        without this, a server that went away costs every remaining item its full retries, silently."""
        if outcome.error is None or error_code(outcome.error) != UNANSWERED:
            self.unanswered_in_a_row = 0
            return
        self.unanswered_in_a_row += 1
        limit = self.cfg.max_connection_failures
        self.log(f"[eval] {item.id}: the server did not answer ({outcome.error}); {self.unanswered_in_a_row} in a "
                 "row" + (f", the run stops at {limit}" if limit else ""))
        if limit and self.unanswered_in_a_row >= limit:
            self.stopped = f"{limit} items in a row could not reach the server (last: {outcome.error})"

    def _record(self, item: Item, planned: Planned, outcome: Outcome) -> dict:
        gen, err = outcome.generation, outcome.error
        raw = gen.text if gen is not None else ""
        extra: dict[str, Any] = {
            "fingerprint": self.fingerprint, "content_hash": planned.digest, "status": outcome.status,
            "attempt": planned.attempt, "retries": outcome.retries, "raw": raw,
            "finish_reason": gen.finish_reason if gen is not None else None,
            "reasoning_truncated": gen.reasoning_truncated if gen is not None else False,
            "tokens": None if gen is None else {"prompt": gen.prompt_tokens, "vision_before": gen.vision_tokens_before,
                                                "vision_after": gen.vision_tokens_after, "audio": gen.audio_tokens,
                                                "new": gen.new_tokens},
            "notes": list(gen.notes) if gen is not None else [],
            "error_class": None if err is None else error_code(err),
            "error_type": None if err is None else type(err).__name__,
            "error_message": None if err is None else str(err)[:2000],
            "retriable": outcome.retriable if outcome.status != "ok" else False,
            "timing": {"finished_at": _now(), "elapsed_s": round(outcome.elapsed_s, 4),
                       "ttft_s": None if gen is None or gen.time_to_first_token_s is None
                       else round(gen.time_to_first_token_s, 4)},
        }
        if outcome.status == "timeout" and err is None:
            extra["error_class"] = "timeout"
        return self.task.prediction_record(item, self.task.postprocess(raw), **extra)

    # --- main ------------------------------------------------------------------------------------
    def run(self) -> dict | None:
        """Run (or resume) the evaluation. Rank 0 returns the summary; other ranks return None."""
        t0, started = time.monotonic(), _now()
        cfg, dist = self.cfg, self.dist
        plan = plan_items(self.task, cfg)
        existing = self._read_all()
        if existing and not cfg.resume:
            raise OutputExistsError(f"{self.records_dir} already holds {len(existing)} records; pass --resume to "
                                    "continue that run (records of another configuration are never reused), "
                                    "or choose another --out")
        dist.barrier()  # every rank has looked before any rank appends
        done, other = self._index(plan, existing)
        pending = self._pending(plan, done)
        mine = sum(1 for p in plan if p.index % dist.world == dist.rank)
        self.log(f"[eval] {self.task.name}: {len(plan)} items, fingerprint {self.fingerprint}; rank {dist.rank}/"
                 f"{dist.world}: {mine - len(pending)} done, {len(pending)} to run"
                 + (f"; {other} records of another configuration, item version or item set ignored" if other else ""))
        if cfg.thinking and cfg.max_new_tokens is None and pending:
            self.log(f"[eval] warning: reasoning on with the harness budget of {self.settings.max_new_tokens} new "
                     "tokens: generation usually ends inside the think block (docs/eval_scoring.md §0); pass "
                     "--max-new-tokens")
        writer = RecordWriter(self.records_dir / f"rank{dist.rank}.jsonl")
        if writer.repaired_bytes:
            self.log(f"[eval] cut a torn last line ({writer.repaired_bytes} bytes) off {writer.path}; that item "
                     "is redone")
        try:
            self._run_pending(pending, writer)
        finally:
            writer.close()
            if self._own_backend and self._backend is not None:
                self._backend.close()
        self.stats["wall_s"] = time.monotonic() - t0
        self.stats["worker_restarts"] = getattr(self._backend, "restarts", 0)
        write_atomic(self.records_dir / f"rank{dist.rank}.stats.json", json.dumps(self.stats))
        dist.barrier()  # all shards are final
        if not dist.main:
            return None
        return self.finish(plan, started, time.monotonic() - t0)

    def _run_pending(self, pending: list[Planned], writer: RecordWriter) -> None:
        if not pending:
            return

        by_index = {p.index: p for p in pending}
        if any(p.problem is None for p in pending):  # load the model now, so item timings exclude it
            start = time.monotonic()
            if hasattr(self.backend, "info"):
                self.backend.info()
            self.stats["backend_start_s"] = round(time.monotonic() - start, 3)
        bar = tqdm(total=len(pending), desc=self.task.name, unit="item", file=sys.stderr, dynamic_ncols=True,
                   disable=not (self.cfg.progress and self.dist.main), smoothing=0.05)
        batch: list[tuple[Item, Planned]] = []
        loop_start = time.monotonic()

        def flush():
            outcomes = self._batch([item for item, _ in batch])
            for (item, planned), outcome in zip(batch, outcomes):
                writer.append(self._record(item, planned, outcome))
                self.stats["items_run"] += 1
                self.stats["errors"] += outcome.status != "ok"
            bar.update(len(outcomes))
            bar.set_postfix(errors=self.stats["errors"], retries=self.stats["retries"], refresh=False)
            batch.clear()

        try:
            for index, item, problem in iter_items(self.task, self.cfg, wanted=set(by_index)):
                planned = by_index[index]
                if problem is not None or planned.problem is not None:
                    e = problem or planned.problem
                    writer.append(self._record(item, planned, Outcome("error", None, e, False)))
                    self.stats["items_run"] += 1
                    self.stats["errors"] += 1
                    bar.update(1)
                    continue
                batch.append((item, planned))
                if len(batch) >= self.cfg.batch_size:
                    flush()
                if self.stopped:
                    break
            if batch and not self.stopped:
                flush()
        finally:
            bar.close()
            self.stats["loop_s"] = round(time.monotonic() - loop_start, 3)
        if self.stopped:
            left = len(pending) - self.stats["items_run"]
            self.stats["stopped"] = self.stopped
            self.log(f"[eval] stopped: {self.stopped}; {left} item{'s' * (left != 1)} not run. Start the server "
                     "again and rerun the same command with --resume: it runs those and redoes the unanswered ones")

    # --- merge and summary -----------------------------------------------------------------------
    def merged_records(self, plan: list[Planned]) -> tuple[list[dict], list[str]]:
        done, _ = self._index(plan, self._read_all())
        records, missing = [], []
        for p in plan:
            final = final_record(done.get(p.id, []))
            if final is None:
                missing.append(p.id)
            else:
                records.append(final)
        return records, missing

    def finish(self, plan: list[Planned], started: str, wall_s: float) -> dict:
        records, missing = self.merged_records(plan)
        write_atomic(self.out / "predictions.jsonl", b"".join(dumps(r) for r in records))
        rank_stats = []
        for r in range(self.dist.world):
            f = self.records_dir / f"rank{r}.stats.json"
            rank_stats.append(json.loads(f.read_text()) if f.exists() else {})
        summary = build_summary(self.task, records, self.header(), missing)
        items_run = sum(s.get("items_run", 0) for s in rank_stats)
        loop_s = max((s.get("loop_s", 0.0) for s in rank_stats), default=0.0)
        summary["run"] = {
            "started_at": started, "finished_at": _now(), "wall_s": round(wall_s, 3),
            "items_run": items_run,
            "items_per_s": round(items_run / loop_s, 4) if loop_s > 0 and items_run else None,
            "items_per_s_note": "items run by all processes / the longest process's loop time (model load excluded)",
            "backend_start_s": max((s.get("backend_start_s", 0.0) for s in rank_stats), default=0.0),
            "generation_s_in_records": round(sum((r.get("timing") or {}).get("elapsed_s", 0.0) for r in records), 3),
            "world_size": self.dist.world, "batch_size": self.cfg.batch_size, "isolation": self.cfg.isolation,
            "decode_sandbox": self.cfg.decode_sandbox, "item_timeout_s": self.cfg.item_timeout_s,
            "retries": sum(s.get("retries", 0) for s in rank_stats),
            "batch_splits": sum(s.get("batch_splits", 0) for s in rank_stats),
            "worker_restarts": sum(s.get("worker_restarts", 0) for s in rank_stats),
            "device": self.device, "code": code_versions(),
            "stopped": next((s["stopped"] for s in rank_stats if s.get("stopped")), None),
        }
        write_atomic(self.out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        write_atomic(self.out / "summary.md", summary_markdown(summary))
        return summary

    def header(self) -> dict:
        """The run header of docs/eval_scoring.md §0 (everything that makes two numbers comparable)."""
        head = self.task.header()
        s = self.settings
        head.update({
            "split": self.cfg.split, "data": str(Path(self.cfg.data).resolve()), "limit": self.cfg.limit,
            "prompt_suffix": self.task.post_prompt, "max_new_tokens": s.max_new_tokens,
            "max_new_tokens_source": "--max-new-tokens" if self.cfg.max_new_tokens else head["max_new_tokens_source"],
            "reasoning_mode": "/think" if s.thinking else "/no_think",
            "decoding": {"temperature": 0.0, "do_sample": False, "top_p": 1.0, "num_beams": 1},
            "fps": s.fps, "max_frames": s.max_frames, "max_num_tiles": s.max_num_tiles,
            "evs_rate": s.video_pruning_rate, "skip_blank_tiles": s.skip_blank_tiles,
            "token_pruning_rate": s.token_pruning_rate, "precision": self.facts.get("precision"),
            "device_type": self.device.split(":")[0], "seeds": {"torch": s.seed},
            "model": self.facts.get("path"), "remote": self.facts.get("remote"),
            "model_digests": {k: self.facts.get(k) for k in ("weights_digest", "config_digest", "files_digest")},
            "fingerprint": self.fingerprint, "record_format": RECORD_FORMAT,
        })
        named = {"video_pruning_rate", "thinking"}  # above as evs_rate and reasoning_mode
        head.update({n: getattr(s, n) for n in EVAL_OPTIONS if n not in head and n not in named})
        return head


def run(cfg: RunConfig, **kwargs) -> dict | None:
    """Convenience: `Runner(cfg, **kwargs).run()`."""
    return Runner(cfg, **kwargs).run()


__all__ = ["RunConfig", "Runner", "Dist", "run", "model_facts", "fingerprint", "file_digest", "item_digest",
           "plan_items", "iter_items", "classify", "RecordsWriteError", "OutputExistsError", "RunOptionError"]
