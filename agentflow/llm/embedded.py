"""An in-process transformers engine that batches concurrent requests.

Callers on any thread call ``complete``; one worker thread gathers the requests that arrive within a short window
(up to ``max_batch``, grouped by identical sampling settings), runs one left-padded ``generate`` for the group, and
hands each caller its own tokens, text and per-token logprobs (log-softmax of the raw logits, as vLLM reports them).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from agentflow.errors import EngineError, EngineTimeout
from agentflow.llm import structured
from agentflow.llm.base import Completion, Message, Sampling

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    deadline: float
    json_schema: dict | None = None
    future: Future = field(default_factory=Future)

    def batch_key(self) -> tuple:
        s = self.sampling
        alone = id(self) if self.json_schema else None  # structured requests are decoded one at a time
        return (s.temperature, s.top_p, s.seed, s.stop, alone)


class EmbeddedEngine:
    supports_structured_output = True  # flat string/enum schemas (structured.py); others fall back to free text

    def __init__(self, model_dir: str | Path, *, version: str = "", max_batch: int = 8, batch_wait_s: float = 0.02,
                 dtype: str = "float32", threads: int | None = None):
        import torch
        from transformers import AutoTokenizer

        from agentflow.llm.models import load_causal_lm

        if threads:
            torch.set_num_threads(threads)
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists():
            raise EngineError(f"no model at {model_dir} (expected a Hugging Face folder with config.json)",
                              reason="invalid_input")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if dtype not in ("float32", "bfloat16"):
            raise EngineError(f"dtype must be float32 or bfloat16, got {dtype!r}", reason="invalid_input")
        self.model = load_causal_lm(model_dir, dtype=dtype).eval()
        self.version = version or model_dir.name
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="embedded-engine", daemon=True)
        self._worker.start()

    # --- the Engine contract -------------------------------------------------------------------------------------
    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        started = time.monotonic()
        schema = json_schema if structured.supports(json_schema) else None
        request = _Request(self.encode_chat(messages), sampling, started + timeout, schema)
        self._queue.put(request)
        try:
            completion = request.future.result(timeout=max(timeout, 0.0))
        except FutureTimeout:
            raise EngineTimeout(f"embedded engine did not finish within {timeout:.1f} s") from None
        completion.latency_s = time.monotonic() - started
        return completion

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=5)

    # --- the worker ----------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        pending: list[_Request] = []
        while True:
            if not pending:
                first = self._queue.get()
                if first is None:
                    return
                pending.append(first)
            self._gather(pending)
            batch = [r for r in pending if r.batch_key() == pending[0].batch_key()][: self.max_batch]
            pending = [r for r in pending if r not in batch]
            live = [r for r in batch if r.future.set_running_or_notify_cancel() and r.deadline > time.monotonic()]
            for r in batch:
                if r not in live and not r.future.done():
                    r.future.set_exception(EngineTimeout("request expired while queued"))
            if live:
                self._run_batch(live)

    def _gather(self, pending: list[_Request]) -> None:
        """Collect what arrives within the batching window, without waiting once the batch is full."""
        until = time.monotonic() + self.batch_wait_s
        while len(pending) < self.max_batch:
            try:
                item = self._queue.get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                return
            if item is None:
                self._queue.put(None)  # stop after this batch
                return
            pending.append(item)

    def _run_batch(self, batch: list[_Request]) -> None:
        try:
            if batch[0].json_schema:
                results = [structured.decode(self, batch[0].prompt_ids, batch[0].json_schema, batch[0].sampling,
                                             batch[0].deadline)]
            else:
                results = self.generate([r.prompt_ids for r in batch], batch[0].sampling,
                                        max_new_tokens=[r.sampling.max_tokens for r in batch],
                                        max_time=max(r.deadline for r in batch) - time.monotonic())
        except EngineTimeout as e:
            for r in batch:
                r.future.set_exception(e)
            return
        except Exception as e:  # one bad batch must not kill the worker
            log.exception("embedded generation failed")
            for r in batch:
                r.future.set_exception(EngineError(f"generation failed: {e}"))
            return
        for r, completion in zip(batch, results):
            r.future.set_result(completion)

    def generate(self, prompts: list[list[int]], sampling: Sampling, *, max_new_tokens: list[int],
                 max_time: float | None = None) -> list[Completion]:
        """One left-padded ``generate`` over ``prompts``; each result is cut at its own EOS and token budget."""
        import torch

        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        sample = sampling.temperature > 0
        kwargs = dict(do_sample=sample, max_new_tokens=max(max_new_tokens), return_dict_in_generate=True,
                      output_logits=True, pad_token_id=pad)
        if sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if max_time is not None:
            kwargs["max_time"] = max(max_time, 0.01)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        new_tokens = out.sequences[:, width:]
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)
        chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        eos = set(_as_list(self.model.generation_config.eos_token_id))
        return [self._completion(prompts[i], new_tokens[i].tolist(), chosen[i].tolist(), max_new_tokens[i], eos,
                                 sampling.stop)
                for i in range(len(prompts))]

    def _completion(self, prompt, tokens, logprobs, budget, eos, stop) -> Completion:
        finish = "length"
        for n, token in enumerate(tokens[:budget]):
            if token in eos:
                tokens, finish = tokens[: n + 1], "stop"
                break
        else:
            tokens = tokens[:budget]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        for s in stop:
            if s in text:
                text, finish = text[: text.index(s)], "stop"
        return Completion(text=text, prompt_token_ids=list(prompt), token_ids=tokens, logprobs=logprobs[: len(tokens)],
                          model_version=self.version, finish_reason=finish)


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
