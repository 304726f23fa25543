"""Continuous batching over the radix cache.

Each `step()` runs one forward pass: an extend batch (prefill of newly admitted
requests, from their cached prefix, chunked to `chunked_prefill_size`) when there is
something to admit, otherwise one decode step for every running request. When a
decode step lacks KV slots, the newest requests are retracted to the waiting queue;
their KV goes into the radix tree, so a resume often re-prefills nothing.

Overlap (on by default on CUDA): a decode pass of plain requests is launched and its
sampled ids stay on the GPU; the next step launches the following pass from those ids
first and only then reads them back and does the per-request work (stop checks,
outputs), so the GPU never waits for the host between decode steps. A request that
finishes this way has had one extra token computed; it is dropped.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from radixflow.host_copy import to_device_async
from radixflow.radix_cache.radix_tree import RadixCache
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.kv_manager import KVManager
from radixflow.runtime.logprobs import LogprobCollector
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.req import Req, ReqOutput, ReqState
from radixflow.runtime.sampler import SampleResult, record_sampled, sample
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.stop_checker import StopChecker

log = logging.getLogger(__name__)

IN_BATCH_PREFIX_THRESHOLD = 32  # defer a request sharing this many uncached tokens with one being admitted
LPM_MAX_WAITING = 128  # above this, lpm falls back to fcfs (matching every request costs)
NEW_TOKEN_RATIO_INIT, NEW_TOKEN_RATIO_MIN, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001


@dataclass
class InflightDecode:
    """A decode pass launched but not yet read back."""

    reqs: list
    result: SampleResult  # next_ids on the device: the next pass's input
    host_ids: torch.Tensor  # [B] their host copy, valid once `ready` has completed
    ready: Optional[torch.cuda.Event]


class Scheduler:
    def __init__(self, args: ServerArgs, runner: ModelRunner, tokenizer, eos_ids: set):
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.tree = RadixCache(runner.kv_pool.allocator, args.page_size, disable=args.disable_radix_cache)
        self.kv = KVManager(runner.kv_pool, runner.req_to_token, self.tree)
        self.stops = StopChecker(tokenizer, eos_ids)
        self.logprobs = LogprobCollector(tokenizer)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Optional[Req] = None  # a request in the middle of a chunked prefill
        self.pending_grammar: list[Req] = []
        self._seq = itertools.count()
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self.stats = SchedulerStats()
        self.grammar_backend = None  # created on the first constrained request
        self.emit_outputs = True  # the in-process Engine reads requests directly and turns this off
        self.jump_forward: Optional[Callable[[Req], object]] = None
        # request graphs: called when a request finishes; returns True after appending
        # the next segment's tokens to it (it then stays running, its KV kept)
        self.continue_hook: Optional[Callable[[Req], bool]] = None
        self.device = runner.device
        self.overlap = args.overlap_enabled(self.device)
        self.inflight: Optional[InflightDecode] = None

    # -- requests in and out --------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        req.arrival_seq = next(self._seq)
        if req.sampling.sampling_seed is not None:
            req.generator = torch.Generator(device=self.device).manual_seed(req.sampling.sampling_seed)
        if req.sampling.repetition_penalty != 1.0:
            mask = torch.zeros(self.runner.vocab_size, dtype=torch.bool, device=self.device)
            mask[torch.tensor(req.origin_input_ids, device=self.device)] = True
            req.prompt_mask = mask
        if req.logprob.return_logprob and req.logprob.logprob_start_len >= 0:
            req.input_logprob_next = req.logprob.logprob_start_len
        if req.sampling.grammar is not None:
            self._grammars().submit(req)  # compiles off this loop; the request waits
            req.state = ReqState.GRAMMAR_PENDING
            self.pending_grammar.append(req)
        else:
            req.state = ReqState.WAITING
            self.waiting.append(req)

    def abort(self, rid: str) -> Optional[Req]:
        for queue in (self.waiting, self.pending_grammar, self.running):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    return self._abort(req)
        if self.chunked is not None and self.chunked.rid == rid:
            req, self.chunked = self.chunked, None
            return self._abort(req)
        return None

    def _abort(self, req: Req) -> Req:
        self.kv.release(req, cache=False)
        req.finish({"type": "abort", "message": "aborted by request"})
        req.state = ReqState.FINISHED
        return req

    def has_work(self) -> bool:
        # an in-flight pass's unfinished requests are all in `running`
        return bool(self.waiting or self.running or self.chunked or self.pending_grammar)

    @property
    def num_running(self) -> int:
        return len(self.running) + (self.chunked is not None)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; only when idle (like SGLang)."""
        if self.has_work():
            return False
        self.inflight = None  # only finished requests' extra tokens were in flight
        self.tree.reset()
        self.runner.kv_pool.allocator.clear()
        self.runner.req_to_token.clear()
        return True

    # -- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[ReqOutput]:
        touched = self._poll_grammars()
        batch = self._form_extend_batch()
        if self.inflight is not None:
            chained = None if batch else self._chain_decode()
            if chained is not None:
                return self._outputs(touched + chained)
            touched += self._drain()
        if batch:
            touched += self._run_extend(batch)
        elif self.running:
            touched += self._decode()
        return self._outputs(touched)

    def _outputs(self, touched: list[Req]) -> list[ReqOutput]:
        return [self._output(r) for r in touched] if self.emit_outputs else []

    def _grammars(self):
        if self.grammar_backend is None:
            from radixflow.constrained.backend import GrammarBackend

            self.grammar_backend = GrammarBackend(self.tokenizer, self.runner.vocab_size, self.eos_ids, self.args)
            if not self.args.disable_jump_forward:
                self.jump_forward = self.grammar_backend.jump_forward
        return self.grammar_backend

    def _poll_grammars(self) -> list[Req]:
        """Move requests whose grammar has compiled to the waiting queue; finish those
        whose grammar failed (the backend sets their finish reason)."""
        if not self.pending_grammar:
            return []
        if not (self.waiting or self.running or self.chunked):  # idle: wait, don't spin
            self.grammar_backend.wait(self.pending_grammar, timeout=0.005)
        still, failed = [], []
        for req in self.pending_grammar:
            ready = self.grammar_backend.poll(req)  # None: not yet; True: compiled; False: failed
            if ready is None:
                still.append(req)
            elif ready:
                req.state = ReqState.WAITING
                self.waiting.append(req)
            else:
                assert req.finished, "a failed grammar must finish its request"
                req.state = ReqState.FINISHED
                failed.append(req)
        self.pending_grammar = still
        return failed

    # -- admission ------------------------------------------------------------------------------
    def _match_limit(self, req: Req) -> int:
        """Longest prefix we may reuse: at least one token must be computed (for logits),
        and input logprobs need the logits of the positions they cover."""
        limit = req.seq_len - 1
        if req.needs_input_logprobs:
            limit = min(limit, max(req.input_logprob_next - 1, 0))
        return limit

    def _ordered_waiting(self) -> list[tuple[Req, object]]:
        pairs = [(r, None) for r in self.waiting]
        if self.args.schedule_policy == "lpm" and len(self.waiting) <= LPM_MAX_WAITING and not self.tree.disable:
            pairs = [(r, self.kv.match(r, self._match_limit(r))) for r in self.waiting]
            pairs.sort(key=lambda p: (-p[1].length, p[0].arrival_seq))
        else:
            pairs.sort(key=lambda p: p[0].arrival_seq)
        return pairs

    def _reserved_decode_slots(self) -> int:
        return int(
            sum(min(r.sampling.max_new_tokens - len(r.output_ids), 4096) for r in self.running) * self.new_token_ratio
        )

    def _form_extend_batch(self) -> list[tuple[Req, int]]:
        """Pick requests to prefill now; returns (req, tokens this pass) pairs, slots allocated."""
        budget = self.args.chunked_prefill_size if self.args.chunked_prefill_size > 0 else self.args.max_prefill_tokens
        budget = min(budget, self.args.max_prefill_tokens)
        batch: list[tuple[Req, int]] = []
        if self.chunked is not None:
            req = self.chunked
            n = min(req.seq_len - req.kv_len, budget)
            if self.kv.alloc(req, n) is None:
                return []  # wait for decode to finish requests; nothing else can be admitted
            batch.append((req, n))
            budget -= n
            if req.kv_len + n < req.seq_len:
                return batch
            self.chunked = None
        if not self.waiting or budget <= 0:
            return batch
        in_batch = RadixCache(allocator=None, page_size=1)
        reserved = self._reserved_decode_slots()
        admitted = set()
        for req, match in self._ordered_waiting():
            if self.num_running + len(admitted) >= self.args.max_running_requests or budget <= 0:
                break
            match = match if match is not None else self.kv.match(req, self._match_limit(req))
            if not self.tree.disable and not self._fresh_enough(req, match, in_batch):
                continue
            extend = req.seq_len - match.length
            chunk = min(extend, budget)
            if chunk < extend and self.args.chunked_prefill_size <= 0 and batch:
                break
            if chunk < extend and self.args.chunked_prefill_size <= 0:
                chunk = extend
            need = chunk + self.args.page_size + int(min(req.sampling.max_new_tokens, 4096) * self.new_token_ratio)
            if self.kv.available_slots() - reserved < need and (batch or self.running):
                break
            if not self.kv.admit(req, match):
                break
            if self.kv.alloc(req, chunk) is None:
                self.kv.release(req, cache=False)
                break
            if req.num_retractions == 0:
                req.cached_tokens = match.length
            self.stats.cached_tokens += match.length
            self.stats.prompt_tokens += req.seq_len
            admitted.add(id(req))
            req.state = ReqState.RUNNING
            batch.append((req, chunk))
            budget -= chunk
            reserved += int(min(req.sampling.max_new_tokens, 4096) * self.new_token_ratio)
            if chunk < extend:
                self.chunked = req
                break
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        return batch

    def _fresh_enough(self, req: Req, match, in_batch: RadixCache) -> bool:
        """In-batch prefix sharing: if this request shares a long uncached prefix with one
        already admitted this round, wait a round and reuse its KV instead."""
        key = req.fill_ids
        shared = in_batch.match_prefix(key).length
        if shared - match.length > IN_BATCH_PREFIX_THRESHOLD:
            return False
        in_batch.insert(key, torch.zeros(len(key), dtype=torch.int64))
        return True

    # -- extend ----------------------------------------------------------------------------------
    def _run_extend(self, batch: list[tuple[Req, int]]) -> list[Req]:
        ids, pos, locs, rows = [], [], [], []
        start = 0
        for req, n in batch:
            fill = req.fill_ids
            ids.extend(fill[req.kv_len : req.kv_len + n])
            pos.append(torch.arange(req.kv_len, req.kv_len + n))
            locs.append(self.kv.req_to_token.read(req.req_pool_idx, req.kv_len + n)[req.kv_len :])
            rows.append(self._logit_rows_for(req, n, start))
            start += n
        prefix = [r.kv_len for r, _ in batch]
        ext = [n for _, n in batch]
        fb = self._forward_batch(ForwardMode.EXTEND, ids, torch.cat(pos), torch.cat(locs), batch, prefix, ext, rows)
        logits = self.runner.forward(fb)
        self.stats.extend_tokens += len(ids)

        finishing, offset = [], 0
        for (req, n), req_rows in zip(batch, rows):
            req_logits = logits[offset : offset + len(req_rows)]
            offset += len(req_rows)
            if req.needs_input_logprobs:
                self.logprobs.add_input(req, req_logits, req.kv_len, n)
            req.kv_len += n
            self.kv.cache_unfinished(req)  # share what is computed so far
            if req.kv_len < req.seq_len:  # more chunks to come
                continue
            if req.sampling.max_new_tokens == 0:
                req.finish({"type": "length", "length": 0})
                self._retire(req)
                continue
            finishing.append((req, req_logits[-1:]))
        touched = [r for r, _ in batch if r.finished]
        if finishing:
            reqs = [r for r, _ in finishing]
            self._sample_and_advance(reqs, torch.cat([lg for _, lg in finishing]))
            for r in reqs:
                if not r.finished:
                    self.running.append(r)
            touched += reqs
        return touched

    def _logit_rows_for(self, req: Req, n: int, start: int) -> list:
        """Rows of this chunk whose logits we need: all (input logprobs) or the last (sampling)."""
        done = req.kv_len + n >= req.seq_len
        if req.needs_input_logprobs:
            return list(range(start, start + n))
        return [start + n - 1] if done else []

    def _forward_batch(self, mode, ids, positions, locs, batch, prefix, ext, rows) -> ForwardBatch:
        """`ids`: a list, or a tensor already on the device (overlapped decode); the rest host-side."""
        seq = [p + e for p, e in zip(prefix, ext)]
        flat_rows = [i for r in rows for i in r] or [0]
        pool_rows = [r.req_pool_idx for r, _ in batch]
        host_ids = ids if isinstance(ids, list) else []
        # one asynchronous host-to-device copy for all of the pass's index tensors
        packed = to_device_async(torch.cat([torch.tensor(host_ids + pool_rows + seq + prefix + ext + flat_rows, dtype=torch.int64),
                                            positions.to(torch.int64), locs.to(torch.int64)]), self.device)  # fmt: skip
        b = len(batch)
        sizes = [len(host_ids), b, b, b, b, len(flat_rows), positions.numel(), locs.numel()]
        ids_t, rows_t, seq_t, pre_t, ext_t, logit_t, pos_t, loc_t = torch.split(packed, sizes)
        ids_t = ids_t if isinstance(ids, list) else ids
        return ForwardBatch(
            mode=mode, input_ids=ids_t, positions=pos_t, out_cache_loc=loc_t, req_pool_indices=rows_t,
            seq_lens=seq_t, prefix_lens=pre_t, extend_lens=ext_t, logits_indices=logit_t,
            seq_lens_list=seq, prefix_lens_list=prefix, extend_lens_list=ext,
        )  # fmt: skip

    # -- decode ----------------------------------------------------------------------------------
    def _decode(self) -> list[Req]:
        reqs = self.running
        if self.overlap and all(r.seq_len - r.kv_len == 1 and self._overlappable(r) for r in reqs) and self._room_for(reqs):
            self.inflight = self._launch_decode(list(reqs), None)
            return []
        return self._run_decode()

    def _overlappable(self, req: Req) -> bool:
        """Requests whose sampling needs nothing from the host's view of the last token."""
        s = req.sampling
        return (
            req.grammar is None
            and not req.logprob.return_logprob
            and not req.continuable
            and s.frequency_penalty == 0 and s.presence_penalty == 0 and s.repetition_penalty == 1.0
            and req.segment_len > s.min_new_tokens  # the stop-token mask must not depend on the lag
        )  # fmt: skip

    def _room_for(self, reqs: list) -> bool:
        """Free or evictable slots for every pending token of `reqs` and one more each, in any page layout."""
        pending = sum(r.seq_len - r.kv_len for r in reqs)
        return self.kv.available_slots() >= (pending + len(reqs)) * self.args.page_size

    def _launch_decode(self, reqs: list[Req], ids: Optional[torch.Tensor]) -> InflightDecode:
        """Launch one decode pass; `ids` (on the device) are its input tokens, else each
        request's last output. Nothing here waits for the GPU."""
        prefix = [r.kv_len for r in reqs]
        locs = self.kv.alloc_decode(reqs)
        assert locs is not None, "decode room was checked"
        ids = [r.output_ids[-1] for r in reqs] if ids is None else ids
        batch = [(r, 1) for r in reqs]
        positions = torch.tensor(prefix, dtype=torch.int64)
        fb = self._forward_batch(ForwardMode.DECODE, ids, positions, locs, batch, prefix, [1] * len(reqs), [[i] for i in range(len(reqs))])  # fmt: skip
        logits = self.runner.forward(fb)
        for r in reqs:
            r.kv_len += 1
        result = sample(logits, reqs, self.eos_ids, self.args.enable_deterministic_inference)
        host_ids = result.next_ids.to("cpu", non_blocking=True)
        ready = None
        if result.next_ids.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        return InflightDecode(reqs, result, host_ids, ready)

    def _chain_decode(self) -> Optional[list[Req]]:
        """Launch the next pass from the in-flight pass's ids, then read those back; None
        (nothing launched) when the in-flight pass must be drained first."""
        prev = self.inflight
        keep = [i for i, r in enumerate(prev.reqs) if not r.finished]  # finished: aborted meanwhile
        reqs = [prev.reqs[i] for i in keep]
        if not reqs or self.chunked is not None or not self._room_for(reqs):
            return None
        ids = prev.result.next_ids
        if len(keep) < len(prev.reqs):
            ids = ids[to_device_async(torch.tensor(keep), ids.device)]
        self.inflight = self._launch_decode(reqs, ids)
        self.stats.chained_decode_steps += 1
        return self._read_back(prev)

    def _drain(self) -> list[Req]:
        prev, self.inflight = self.inflight, None
        return self._read_back(prev)

    def _read_back(self, done: InflightDecode) -> list[Req]:
        """Per-request work for a completed decode pass."""
        if done.ready is not None:
            done.ready.synchronize()
        reqs = self._advance(done.reqs, done.host_ids.tolist(), done.result)
        self.running = [r for r in self.running if not r.finished]
        self.stats.decode_tokens += len(reqs)
        return reqs

    def _run_decode(self) -> list[Req]:
        """One token per running request, read back at once; requests holding several
        pending tokens (jump-forward, appended program text) make it an extend pass."""
        self._make_room_for_decode()
        if not self.running:
            return []
        reqs = list(self.running)
        ext = [r.seq_len - r.kv_len for r in reqs]
        assert min(ext) >= 1, "a running request has no pending token"
        if max(ext) == 1:
            return self._read_back(self._launch_decode(reqs, None))
        prefix = [r.kv_len for r in reqs]
        ids, positions, locs, rows = self._pending_tokens(reqs, ext)
        fb = self._forward_batch(ForwardMode.EXTEND, ids, positions, locs, list(zip(reqs, ext)), prefix, ext, rows)
        logits = self.runner.forward(fb)
        for r, n in zip(reqs, ext):
            r.kv_len += n
        self._sample_and_advance(reqs, logits)
        self.running = [r for r in self.running if not r.finished]
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        self.stats.decode_tokens += len(reqs)
        return reqs

    def _pending_tokens(self, reqs: list[Req], ext: list[int]):
        """Inputs of a continuation pass where some requests hold several pending tokens."""
        locs, ids, pos = [], [], []
        for req, n in zip(reqs, ext):
            slots = self.kv.alloc(req, n)
            assert slots is not None, "decode room was reserved"
            locs.append(slots)
            ids.extend(req.pending_ids())
            pos.append(torch.arange(req.kv_len, req.kv_len + n))
        ends = torch.tensor(ext).cumsum(0).tolist()
        return ids, torch.cat(pos), torch.cat(locs), [[e - 1] for e in ends]

    def _make_room_for_decode(self) -> None:
        """Retract the newest requests until every running request has a slot for its next token."""
        if self._room_for(self.running):
            return  # enough for any page layout: skip the per-request count
        while self.running:
            need = sum(self.kv.pages_needed(r, r.seq_len - r.kv_len) for r in self.running) * self.args.page_size
            if self.kv.available_slots() >= need:
                return
            victim = max(self.running, key=lambda r: r.arrival_seq)
            self.running.remove(victim)
            self._retract(victim)

    def _retract(self, req: Req) -> None:
        self.kv.release(req, cache=True)
        req.state = ReqState.WAITING
        req.num_retractions += 1
        self.stats.retractions += 1
        self.waiting.append(req)
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1)
        log.info("retracted %s (%d tokens so far) for lack of KV slots", req.rid, len(req.output_ids))

    # -- sampling, finishing -----------------------------------------------------------------------
    def _sample_and_advance(self, reqs: list[Req], logits: torch.Tensor) -> None:
        result = sample(logits, reqs, self.eos_ids, self.args.enable_deterministic_inference)
        self._advance(reqs, result.next_ids.tolist(), result)

    def _advance(self, reqs: list[Req], next_ids: list, result: SampleResult) -> list[Req]:
        """Append each request's sampled token; check stops; retire finished requests.
        A request finished before its token arrived (aborted, or done while an overlapped
        pass computed one token more) drops it. Returns the requests advanced."""
        live = [i for i, r in enumerate(reqs) if not r.finished]
        record_sampled([reqs[i] for i in live], [next_ids[i] for i in live])
        now = time.time()
        for i in live:
            req, tok = reqs[i], next_ids[i]
            req.output_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
            if req.logprob.return_logprob:
                self.logprobs.add_output(req, result, i, tok)
            if req.grammar is not None:
                req.grammar.accept_token(tok)
            self.stops.check(req, self.runner.context_len)
            if not req.finished and req.grammar is not None and self.jump_forward is not None:
                self._apply_jump_forward(req)
            if req.finished and self.continue_hook is not None and self.continue_hook(req):
                assert not req.finished, "a continued request must be unfinished"
            if req.finished:
                self._retire(req)
        return [reqs[i] for i in live]

    def _apply_jump_forward(self, req: Req) -> None:
        """Append tokens the grammar forces, without sampling them; their KV is computed
        by the next pass (which becomes an extend). The hook returns the tokens to
        append, or (keep, tokens) to first cut the output back to `keep` tokens
        (re-tokenizing at the boundary)."""
        forced = self.jump_forward(req)
        if not forced:
            return
        keep, tokens = forced if isinstance(forced, tuple) else (len(req.output_ids), forced)
        if keep < len(req.output_ids):
            self.rewind(req, keep)
        req.output_ids.extend(tokens)
        req.jump_forward_tokens += len(tokens)
        self.stops.check(req, self.runner.context_len)

    def rewind(self, req: Req, keep_outputs: int) -> None:
        """Drop outputs past `keep_outputs`, and the KV of dropped tokens."""
        del req.output_ids[keep_outputs:]
        new_kv = min(req.kv_len, req.seq_len - 1)
        if new_kv < req.kv_len:
            self.kv.truncate(req, new_kv)

    def _retire(self, req: Req) -> None:
        req.state = ReqState.FINISHED
        self.kv.release(req, cache=True)

    def _output(self, req: Req) -> ReqOutput:
        return ReqOutput(
            rid=req.rid,
            output_ids=req.output_ids,  # by reference: copied only when sent
            finished=req.finished,
            finish_reason=req.finish_reason,
            prompt_tokens=len(req.origin_input_ids),
            cached_tokens=req.cached_tokens,
            new_output_token_logprobs=req.output_token_logprobs,
            new_output_top_logprobs=req.output_top_logprobs,
            input_token_logprobs=req.input_token_logprobs,
            input_top_logprobs=req.input_top_logprobs,
            num_retractions=req.num_retractions,
            jump_forward_tokens=req.jump_forward_tokens,
        )

    # -- introspection ---------------------------------------------------------------------------------
    def token_usage(self) -> float:
        cap = self.runner.kv_pool.allocator.capacity_slots
        return (cap - self.kv.available_slots()) / cap

    def _owned_pages(self) -> torch.Tensor:
        """Free pages, tree pages and running requests' own pages (with repeats, if any)."""
        alloc = self.runner.kv_pool.allocator
        ps = alloc.page_size
        owners = [alloc._free, torch.unique(self.tree.all_slots() // ps)]
        for req in self.running + ([self.chunked] if self.chunked else []):
            own = self.kv.req_to_token.read(req.req_pool_idx, req.kv_len)[req.tree_len :]
            owners.append(torch.unique(own // ps))
        return torch.cat(owners)

    def check_invariants(self) -> None:
        """Every usable slot is free, owned by one running request, or by one tree node."""
        alloc = self.runner.kv_pool.allocator
        pages = self._owned_pages()
        assert pages.numel() == torch.unique(pages).numel(), "a KV page has two owners"
        assert pages.numel() == alloc.num_pages - 1, f"KV pages leaked: {alloc.num_pages - 1 - pages.numel()}"

    def reclaim_unowned_pages(self) -> int:
        """After a step raised: free pages nobody owns (allocated for a pass that never
        completed, so no request's kv_len covers them). Returns how many."""
        alloc = self.runner.kv_pool.allocator
        lost = torch.ones(alloc.num_pages, dtype=torch.bool)
        lost[0] = False
        lost[self._owned_pages().cpu()] = False
        pages = lost.nonzero().flatten()
        alloc.free(pages)
        return int(pages.numel())


class SchedulerStats:
    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.extend_tokens = 0
        self.decode_tokens = 0
        self.retractions = 0
        self.chained_decode_steps = 0  # decode passes launched before the previous one was read back

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
