"""`vl eval --backend openai`: generations from any OpenAI-compatible server through `vl.server.client.RemoteEngine`.

The runner is unchanged: the same conversations (eval/tasks build them), the same settings (sent as OpenAI
fields and extensions), the same records, resume and scoring. Conversations of one `generate` call go out
`concurrency` at a time, so a server that batches (vl serve, vLLM, SGLang) sees them together. The run
fingerprint names the server's URL and model id instead of checkpoint digests (`remote_facts`), so records
made against one deployment are never reused for another, and a restarted server at the same address with
the same model continues the run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from eval.backend import Generation, GenerationSettings
from vl.errors import InputError
from vl.server.client import RemoteEngine


class RemoteBackend:
    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None, concurrency: int = 4,
                 engine=None, **engine_kwargs):
        if concurrency < 1:
            raise InputError(f"concurrency must be >= 1, found {concurrency}")
        if engine is None:
            engine = RemoteEngine(base_url, api_key=api_key, model=model, **engine_kwargs)
        self.engine, self.concurrency = engine, concurrency
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="vl-eval-remote")

    def info(self) -> dict:
        return {"device": "remote", **self.engine.info()}

    def _one(self, conversation, settings: GenerationSettings) -> Generation:
        kw = settings.chat_kwargs()
        kw["seed"] = settings.seed
        r = self.engine.chat(conversation, timeout_s=settings.timeout_s, **kw)
        s = r.stats
        return Generation(r.text, r.finish_reason, bool(r.reasoning_truncated), s.prompt_tokens,
                          s.vision_tokens_before, s.vision_tokens_after, s.new_tokens, list(s.notes),
                          s.time_to_first_token_s, s.audio_tokens)  # RemoteEngine: usage.audio_tokens, None unreported

    def generate(self, conversations: list, settings: GenerationSettings) -> list[Generation]:
        futures = [self._pool.submit(self._one, c, settings) for c in conversations]
        return [f.result() for f in futures]  # the first failure is raised; the runner redoes items one by one

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.engine.close()


def remote_facts(engine) -> dict:
    """The model part of the run fingerprint for a served model: where, and which model id."""
    return {"path": None, "remote": {"base_url": engine.base_url, "model": engine.model_name},
            "precision": "remote", "dtype": None, "max_num_tiles": None, "video_pruning_rate": None}
