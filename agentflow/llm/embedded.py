"""An in-process transformers engine that batches concurrent requests continuously.

Callers on any thread call ``complete``; one worker thread decodes every running request together, one token per
step, over one left-padded KV cache. Between two steps it admits the requests that arrived (prefilled together, their
cache rows merged into the batch's, up to ``max_batch`` rows) and drops the rows that finished (EOS, token budget,
stop string, deadline), so the slot of a request that ends early is refilled at the next step instead of idling
until the longest request of a static batch ends. When the engine is idle, the first request waits up to
``batch_wait_s`` for company, so a burst is prefilled in one forward pass.

Each caller gets its own tokens, text and per-token logprobs (log-softmax of the raw logits, as vLLM reports them).
Sampling settings are per row, so requests with different temperatures share a batch; a request with a ``seed``
samples from its own generator, so what it draws does not depend on what it was batched with. Structured requests
(``json_schema``) are decoded one at a time by ``structured.decode``, between two steps of the running batch.

Left padding is exact: pad positions are masked out and position ids count each row's own tokens, so a row's
greedy output is the one it gets alone (up to float summation order). The merge and trim of cache rows work on
plain ``DynamicLayer`` caches (full attention: Llama, Qwen2, ... — the models this project serves).
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import queue
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from agentflow import telemetry
from agentflow.errors import EngineError, EngineTimeout, InvalidInput, Reason
from agentflow.llm import structured
from agentflow.llm.base import Completion, Message, Sampling

log = logging.getLogger(__name__)
GEN_AI_PROVIDER = "agentflow.embedded"  # gen_ai.provider.name of calls this in-process engine answers

# Engines still open at interpreter exit are closed first, their requests cancelled: a worker thread left inside a
# torch kernel while Python finalizes aborts the process ("terminate called without an active exception", exit 134).
_open_engines: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    for engine in list(_open_engines):
        engine.close(cancel=True)


def resolve_dtype(dtype: str, cpu_flags: str | None = None) -> str:
    """``auto``: bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), else float32; others as given."""
    if dtype != "auto":
        return dtype
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                cpu_flags = next((line for line in f if line.startswith("flags")), "")
        except OSError:
            cpu_flags = ""
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(cpu_flags.split()) else "float32"


@dataclass(eq=False)
class _Request:
    """One queued or running request: ``EmbeddedEngine.submit`` returns it; the caller waits on ``future`` and may
    ``cancel`` it (a client that went away), which frees its batch slot at the next step."""

    prompt_ids: list[int]
    sampling: Sampling
    deadline: float
    json_schema: dict | None = None
    future: Future = field(default_factory=Future)
    cancelled: bool = False
    submitted: float = field(default_factory=time.monotonic)
    first_token_s: float = 0.0  # from submit to the first token (queueing and prefill); 0 until then

    def cancel(self) -> None:
        self.cancelled = True
        self.future.cancel()  # still queued: never admitted; running: retired at the next step (``_retire``)


@dataclass(eq=False)
class _Row:
    """One sequence being decoded: its prompt, what it has produced so far and why it stopped."""

    prompt: list[int]
    sampling: Sampling
    budget: int
    deadline: float | None = None  # time.monotonic(); None: no limit
    request: _Request | None = None
    generator: torch.Generator | None = None  # per-request RNG when the request has a seed
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""  # "" while decoding, then "stop", "length", "expired", "cancelled" or "error"
    error: Exception | None = None  # why this row alone failed (finish "error")

    @classmethod
    def make(cls, prompt, sampling: Sampling, budget: int, deadline: float | None, request=None) -> "_Row":
        generator = None
        if sampling.seed is not None and sampling.temperature > 0:
            generator = torch.Generator().manual_seed(int(sampling.seed))
        return cls(list(prompt), sampling, max(1, int(budget)), deadline, request, generator)


class _Batch:
    """Rows decoding together: a left-padded KV cache, its attention mask and each row's next position id.

    Invariants: ``mask`` is (rows, cache length); ``positions[i]`` is the number of real tokens row ``i`` has in the
    cache, i.e. the position id of the token it feeds next (its last sampled one, not yet in the cache).
    """

    def __init__(self, engine: "EmbeddedEngine"):
        self.engine = engine
        self.rows: list[_Row] = []
        self.cache = None
        self.mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    def admit(self, rows: list[_Row]) -> None:
        """Prefill ``rows`` together, sample their first token and merge them into the batch.

        Each prompt starts from the KV of its longest cached prefix (``_PrefixCache``), so only the rest is computed.
        The new rows' cache is laid out ``[pad][cached prefix][pad][computed suffix]``: pads are masked out and the
        position ids count real tokens only, so the layout does not change what a row computes."""
        from transformers import DynamicCache

        engine = self.engine
        engine._prefix.validate()
        hits = [engine._prefix.lookup(r.prompt) for r in rows]
        cached = [n for n, _ in hits]
        prefix_width = max(cached)
        width = max(len(r.prompt) - n for r, n in zip(rows, cached))
        ids = torch.tensor([[engine.pad_id] * (width - len(r.prompt) + n) + r.prompt[n:] for r, n in zip(rows, cached)])
        new_mask = torch.tensor([[0] * (width - len(r.prompt) + n) + [1] * (len(r.prompt) - n)
                                 for r, n in zip(rows, cached)])
        position_ids = torch.tensor(cached)[:, None] + (new_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=engine.model.config)
        _check_layers(cache)
        if prefix_width:
            past_mask = torch.tensor([[0] * (prefix_width - n) + [1] * n for n in cached])
            blank = next(kv for _, kv in hits if kv)  # rows without a hit: all padding, shaped from one that has
            for i, layer in enumerate(cache.layers):
                layer.update(*(torch.stack([_left_pad((kv or blank)[i][j][:, : n], prefix_width, -2)
                                            for n, kv in hits]) for j in (0, 1)))
            mask = torch.cat([past_mask, new_mask], dim=1)
        else:
            mask = new_mask
        logits = engine._forward(ids, mask, position_ids, cache)
        engine._prefix.store([r.prompt for r in rows], cache, mask, hits)
        positions = torch.tensor([len(r.prompt) for r in rows])
        if not self.rows:
            self.cache, self.mask, self.positions = cache, mask, positions
        else:
            length = max(self.mask.shape[1], mask.shape[1])
            for old, new in zip(self.cache.layers, cache.layers):
                old.keys = torch.cat([_left_pad(old.keys, length, -2), _left_pad(new.keys, length, -2)])
                old.values = torch.cat([_left_pad(old.values, length, -2), _left_pad(new.values, length, -2)])
            self.mask = torch.cat([_left_pad(self.mask, length, -1), _left_pad(mask, length, -1)])
            self.positions = torch.cat([self.positions, positions])
        self.rows.extend(rows)
        engine._append(rows, logits)

    def step(self) -> None:
        """Feed every row its last token and sample the next one."""
        ids = torch.tensor([[r.tokens[-1]] for r in self.rows])
        self.mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=self.mask.dtype)], dim=1)
        logits = self.engine._forward(ids, self.mask, self.positions[:, None], self.cache)
        self.positions = self.positions + 1
        self.engine._append(self.rows, logits)

    def drop_finished(self) -> list[_Row]:
        """Remove the rows that have a ``finish`` and return them; trim cache columns that only padding uses."""
        done = [r for r in self.rows if r.finish]
        if not done:
            return []
        keep = [i for i, r in enumerate(self.rows) if not r.finish]
        if not keep:
            self.rows, self.cache, self.mask, self.positions = [], None, None, None
            return done
        index = torch.tensor(keep)
        self.mask = self.mask[index]
        start = int(self.mask.any(0).to(torch.int8).argmax())  # first column some row still uses
        self.mask = self.mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]
        self.positions = self.positions[index]
        self.rows = [self.rows[i] for i in keep]
        return done


class _PrefixCache:
    """The KV of recent prompts, so a new prompt only prefills what follows its longest cached prefix (the chat
    template's system prompt, the modules' shared instructions, a structured request's growing context).

    Exact: under causal attention a prefix's keys and values do not depend on what follows it. Entries are whole
    prompts, evicted least recently used beyond ``max_tokens`` cached tokens in all (0 disables the cache), and all
    dropped as soon as the model's weights change (a trainer's ``load_state_dict`` bumps the parameters' version
    counters). Thread-safe: ``generate`` may run on callers' threads next to the worker."""

    def __init__(self, model, max_tokens: int):
        self.model = model
        self.max_tokens = max_tokens
        self.tokens = 0
        self.hits = 0  # prompt tokens served from the cache
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._lock = threading.Lock()
        self._weights = self._fingerprint()

    def _fingerprint(self) -> int:
        return hash(tuple((id(p), p._version) for p in self.model.parameters()))

    def validate(self) -> None:
        """Drop every entry if the weights changed since they were computed."""
        weights = self._fingerprint()
        with self._lock:
            if weights != self._weights:
                self._entries.clear()
                self.tokens, self._weights = 0, weights

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.tokens = 0

    def lookup(self, prompt: list[int]) -> tuple[int, list | None]:
        """(n, per-layer (keys, values) holding at least ``n`` columns) for the longest cached prefix of ``prompt``,
        at most all but its last token (whose logits the prefill must compute); (0, None) on a miss."""
        if not self.max_tokens:
            return 0, None
        key, best, found = tuple(prompt), 0, None
        with self._lock:
            for cached, kv in self._entries.items():
                n = len(os.path.commonprefix([cached, key]))
                if n > best:
                    best, found = n, (cached, kv)
            if found is None:
                return 0, None
            self._entries.move_to_end(found[0])
            n = min(best, len(prompt) - 1)
            self.hits += n
            return (n, found[1]) if n > 0 else (0, None)

    def store(self, prompts: list[list[int]], cache, mask: torch.Tensor, hits) -> None:
        """Keep each prompt's keys and values (its unmasked columns of ``cache`` right after the prefill)."""
        if not self.max_tokens or self._fingerprint() != self._weights:
            return
        for row, prompt in enumerate(prompts):
            key = tuple(prompt)
            if len(key) > self.max_tokens:
                continue
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    continue
            columns = mask[row].nonzero().squeeze(1)
            kv = [(layer.keys[row].index_select(1, columns), layer.values[row].index_select(1, columns))
                  for layer in cache.layers]
            with self._lock:
                self._entries[key] = kv
                self.tokens += len(key)
                while self.tokens > self.max_tokens:
                    evicted, _ = self._entries.popitem(last=False)
                    self.tokens -= len(evicted)


class EmbeddedEngine:
    supports_structured_output = True  # flat string/enum schemas (structured.py); others fall back to free text

    def __init__(self, model_dir: str | Path, *, version: str = "", max_batch: int = 8, batch_wait_s: float = 0.02,
                 dtype: str = "float32", threads: int | None = None, prefix_cache_tokens: int = 4096,
                 allowed_roots: list[str] | None = None):
        """``allowed_roots``: where a LoRA version's base may come from (``models.adapter_base``); None: anywhere."""
        from transformers import AutoTokenizer

        from agentflow.llm.models import ADAPTER_CONFIG, load_checkpoint

        if threads:
            torch.set_num_threads(threads)
        model_dir = Path(model_dir)
        if not any((model_dir / name).exists() for name in ("config.json", ADAPTER_CONFIG)):
            raise EngineError(f"no model at {model_dir} (expected a Hugging Face folder with config.json, or a LoRA "
                              f"version with {ADAPTER_CONFIG})", reason=Reason.INVALID_INPUT)
        if max_batch < 1:
            raise EngineError(f"max_batch must be at least 1, got {max_batch}", reason=Reason.INVALID_INPUT)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if dtype not in ("float32", "bfloat16"):
            raise EngineError(f"dtype must be float32 or bfloat16, got {dtype!r}", reason=Reason.INVALID_INPUT)
        # a LoRA version: merged into its base
        self.model = load_checkpoint(model_dir, dtype=dtype, allowed_roots=allowed_roots).eval()
        self.version = version or model_dir.name
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.pad_id = self.tokenizer.pad_token_id
        self._eos = frozenset(_as_list(self.model.generation_config.eos_token_id))
        self._prefix = _PrefixCache(self.model, prefix_cache_tokens)
        # transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns until it is removed)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._closed = False
        self._abort = False
        self._running = self._waiting = 0  # the worker's last count, for ``load``
        self._worker = threading.Thread(target=self._serve, name="embedded-engine", daemon=True)
        self._worker.start()
        _open_engines.add(self)

    # --- the Engine contract -------------------------------------------------------------------------------------
    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        started = time.monotonic()
        with telemetry.chat_span(GEN_AI_PROVIDER, self.version, sampling) as span:
            request = self.submit(messages, sampling, timeout=timeout, json_schema=json_schema)
            try:
                completion = request.future.result(timeout=max(timeout, 0.0))
            except FutureTimeout:
                request.cancel()
                raise EngineTimeout(f"embedded engine did not finish within {timeout:.1f} s") from None
            telemetry.record_chat_response(span, response_model=completion.model_version,
                                           finish_reasons=[completion.finish_reason],
                                           input_tokens=len(completion.prompt_token_ids),
                                           output_tokens=len(completion.token_ids),
                                           model_version=completion.model_version)
        completion.latency_s = time.monotonic() - started
        return completion

    def submit(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
               json_schema: dict | None = None, max_prompt_tokens: int | None = None) -> _Request:
        """Queue one request and return it (wait on ``.future``, or ``.cancel()`` it). A prompt over
        ``max_prompt_tokens``, or one that with ``max_tokens`` overflows the model's context, is ``InvalidInput``."""
        if self._closed:
            raise EngineError("the embedded engine is closed")
        prompt = self.encode_chat(messages)
        if max_prompt_tokens is not None and len(prompt) > max_prompt_tokens:
            raise InvalidInput(f"the prompt has {len(prompt)} tokens; this server accepts at most {max_prompt_tokens}")
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context and len(prompt) + sampling.max_tokens > context:
            raise InvalidInput(f"the prompt ({len(prompt)} tokens) plus max_tokens ({sampling.max_tokens}) is over "
                               f"the model's context of {context} tokens")
        schema = json_schema if structured.supports(json_schema) else None
        request = _Request(prompt, sampling, time.monotonic() + timeout, schema)
        self._queue.put(request)
        return request

    def load(self) -> dict:
        """Rows decoding now, requests waiting for a slot, and the batch's capacity (for metrics)."""
        return {"running": self._running, "waiting": self._waiting + self._queue.qsize(), "capacity": self.max_batch}

    @property
    def healthy(self) -> bool:
        """Whether the engine can still answer (not closed, its worker alive)."""
        return not self._closed and self._worker.is_alive()

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def close(self, *, cancel: bool = False) -> None:
        """Stop the worker; new calls fail at once. What is queued or running finishes first (waiting up to 5 s),
        unless ``cancel``: then every request fails now with "the embedded engine is closed" and the worker stops
        after its current decode step (waiting up to 30 s: exit must not overtake it)."""
        self._closed = True
        self._abort = self._abort or cancel
        self._queue.put(None)
        if self._worker is not threading.current_thread():
            self._worker.join(timeout=30.0 if cancel else 5.0)
        _open_engines.discard(self)

    # --- batch generation, synchronous -----------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: Sampling, *, max_new_tokens: list[int],
                 max_time: float | None = None) -> list[Completion]:
        """Decode ``prompts`` as one batch on the calling thread; each ends at its own EOS, stop string or budget.

        ``max_time`` (seconds) stops all rows early with what they have (finish "length"), like transformers'
        ``generate(max_time=...)``. A ``seed`` also seeds torch's global RNG, as before, for callers that keep
        sampling after this call (structured choices).
        """
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        deadline = None if max_time is None else time.monotonic() + max(max_time, 0.01)
        rows = [_Row.make(p, sampling, n, None) for p, n in zip(prompts, max_new_tokens)]
        batch = _Batch(self)
        with torch.inference_mode():
            batch.admit(rows)
            batch.drop_finished()
            while batch.rows:
                if self._abort:
                    raise EngineError("the embedded engine is closed")
                if deadline is not None and time.monotonic() >= deadline:
                    for r in batch.rows:
                        r.finish = "length"
                    break
                batch.step()
                batch.drop_finished()
        failed = next((r.error for r in rows if r.error is not None), None)
        if failed is not None:
            raise EngineError(f"generation failed: {failed}") from failed
        return [self._completion(r) for r in rows]

    # --- the worker ----------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        batch = _Batch(self)
        waiting: deque[_Request] = deque()
        closing = False
        try:
            with torch.inference_mode():
                while True:
                    self._running, self._waiting = len(batch.rows), len(waiting)
                    closing = self._collect(batch, waiting, closing)
                    if self._abort:
                        self._fail(batch, EngineError("the embedded engine is closed"))
                        for request in waiting:
                            if not request.future.done():
                                request.future.set_exception(EngineError("the embedded engine is closed"))
                        return
                    if closing and not batch.rows and not waiting:
                        return
                    try:
                        self._admit(batch, waiting)
                        self._running, self._waiting = len(batch.rows), len(waiting)
                        self._retire(batch)
                        if batch.rows:
                            batch.step()
                            self._retire(batch)
                    except Exception as e:  # nothing one request does may stop the worker: fail the batch only
                        log.exception("embedded decode step failed")
                        self._fail(batch, EngineError(f"generation failed: {e}"))
        finally:
            self._closed = True
            while True:  # whoever is still queued gets an answer now rather than at their deadline
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None and not item.future.done():
                    item.future.set_exception(EngineError("the embedded engine is closed"))

    def _collect(self, batch: _Batch, waiting: deque, closing: bool) -> bool:
        """Move arrivals into ``waiting``: block while idle (then wait ``batch_wait_s`` for a burst), else just poll.

        Returns whether close() was called."""
        idle = not batch.rows and not waiting
        if idle and not closing:
            first = self._queue.get()
            if first is None:
                return True
            waiting.append(first)
            until = time.monotonic() + self.batch_wait_s
            while len(waiting) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    return True
                waiting.append(item)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return closing
            if item is None:
                closing = True
            else:
                waiting.append(item)

    def _admit(self, batch: _Batch, waiting: deque) -> None:
        rows = []
        while waiting and len(batch.rows) + len(rows) < self.max_batch:
            request = waiting.popleft()
            if not request.future.set_running_or_notify_cancel():
                continue
            if request.deadline <= time.monotonic():
                request.future.set_exception(EngineTimeout("request expired while queued"))
            elif request.json_schema:
                self._structured(request)
            else:
                try:
                    rows.append(_Row.make(request.prompt_ids, request.sampling, request.sampling.max_tokens,
                                          request.deadline, request))
                except Exception as e:  # e.g. a seed torch cannot take: this request fails, no other
                    error = EngineError(f"bad sampling settings: {e}", reason=Reason.INVALID_INPUT)
                    request.future.set_exception(error)
        if rows:
            try:
                batch.admit(rows)
                for r in rows:
                    r.request.first_token_s = time.monotonic() - r.request.submitted
            except Exception as e:
                log.exception("embedded prefill failed")
                error = EngineError(f"generation failed: {e}")
                for r in rows:
                    r.request.future.set_exception(error)
                if batch.rows and batch.rows[-1] is rows[-1]:  # merged before failing: the batch is suspect
                    self._fail(batch, error)

    def _structured(self, request: _Request) -> None:
        try:
            result = structured.decode(self, request.prompt_ids, request.json_schema, request.sampling,
                                       request.deadline)
        except EngineError as e:  # its deadline, or close(cancel=True)
            request.future.set_exception(e)
        except Exception as e:
            log.exception("structured decoding failed")
            request.future.set_exception(EngineError(f"generation failed: {e}"))
        else:
            request.future.set_result(result)

    def _retire(self, batch: _Batch) -> None:
        now = time.monotonic()
        for r in batch.rows:
            if r.request is not None and r.request.cancelled:
                r.finish = "cancelled"
            elif not r.finish and r.deadline is not None and now >= r.deadline:
                r.finish = "expired"
        for r in batch.drop_finished():
            if r.request.future.done():
                continue
            if r.finish == "expired":
                r.request.future.set_exception(EngineTimeout("request ran past its deadline while decoding"))
            elif r.finish == "cancelled":
                r.request.future.set_exception(EngineError("cancelled: the caller went away"))
            elif r.finish == "error":
                r.request.future.set_exception(EngineError(f"generation failed: {r.error}"))
            else:
                r.request.future.set_result(self._completion(r))

    def _fail(self, batch: _Batch, error: Exception) -> None:
        for r in batch.rows:
            if not r.request.future.done():
                r.request.future.set_exception(error)
        batch.rows, batch.cache, batch.mask, batch.positions = [], None, None, None

    # --- model and sampling --------------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, cache) -> torch.Tensor:
        """Logits (rows, vocab) at the last position; ``cache`` grows by ``ids.shape[1]`` columns."""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                         logits_to_keep=1, **{self._cache_kw: cache})
        return out.logits[:, -1, :]

    def _append(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Pick each row's next token (greedy or sampled with its settings), record its raw logprob, mark ends."""
        logits = logits.float()
        tokens = logits.argmax(-1).tolist()
        for i, r in enumerate(rows):
            if r.sampling.temperature > 0:
                try:
                    tokens[i] = _sample(logits[i], r.sampling, r.generator)
                except Exception as e:  # one row's settings (checked by the server; not by every caller)
                    r.error = e
        logprobs = logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()
        for r, token, logprob in zip(rows, tokens, logprobs):
            r.tokens.append(token)
            r.logprobs.append(logprob)
            try:
                r.finish = "error" if r.error is not None else self._finish(r)
            except Exception as e:
                r.error, r.finish = e, "error"

    def _finish(self, row: _Row) -> str:
        if row.tokens[-1] in self._eos:
            return "stop"
        if row.sampling.stop:
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
            if any(s in text for s in row.sampling.stop):
                return "stop"
        return "length" if len(row.tokens) >= row.budget else ""

    def _completion(self, row: _Row) -> Completion:
        finish = row.finish or "length"
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        for s in row.sampling.stop:
            if s in text:
                text, finish = text[: text.index(s)], "stop"
        return Completion(text=text, prompt_token_ids=list(row.prompt), token_ids=list(row.tokens),
                          logprobs=list(row.logprobs), model_version=self.version, finish_reason=finish,
                          first_token_s=row.request.first_token_s if row.request is not None else 0.0)


def encode_chat(tokenizer, messages: Sequence[Message]) -> list[int]:
    """A chat's prompt token ids as this engine encodes it: the chat template with the generation prompt."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _sample(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """One token from softmax(logits / temperature), restricted to the top-p nucleus (as transformers' warpers)."""
    scores = logits / sampling.temperature
    if sampling.top_p < 1.0:
        ordered, index = scores.sort()  # ascending
        remove = ordered.softmax(-1).cumsum(-1) <= 1 - sampling.top_p
        remove[-1] = False  # always keep the most likely token
        scores = scores.index_fill(0, index[remove], float("-inf"))
    return int(torch.multinomial(scores.softmax(-1), 1, generator=generator))


def _left_pad(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """``x`` with zeros prepended along ``dim`` up to ``length``."""
    missing = length - x.shape[dim]
    if missing <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _check_layers(cache) -> None:
    from transformers.cache_utils import DynamicLayer

    odd = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if odd:
        raise EngineError(f"continuous batching needs full-attention DynamicLayer caches; this model uses {odd}",
                          reason=Reason.INVALID_INPUT)


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
