"""Continuous batching over the radix cache.

Each `step()` runs one forward pass: an extend batch (prefill of newly admitted requests, from their cached
prefix, chunked to `chunked_prefill_size`; with --enable-mixed-chunk the running requests' next tokens too:
mixed_pass.py) when there is something to admit, otherwise one decode step for every running request. When a
decode step lacks KV slots, the newest requests are retracted to the waiting queue; their KV goes into the
radix tree, so a resume often re-prefills nothing.

Overlap (on by default on CUDA; overlap.py): decode pass n+1 is launched before pass n is read back, constrained
rows included (their masks are filled while the GPU runs the forward pass); a request that finishes this way has
had one extra token computed, dropped. Extend passes overlap too (extend_overlap.py): launched behind an
in-flight decode pass, which is read back while the GPU runs them, and their first tokens read back by the next step.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Callable, Optional

import torch

from radixflow.constrained.backend import jump_parts
from radixflow.constrained.batch_mask import accept_tokens
from radixflow.radix_cache.radix_tree import RadixCache
from radixflow.runtime.execution.forward_batch import ForwardMode
from radixflow.runtime.scheduling.kv_manager import KVManager
from radixflow.runtime.scheduling.kv_reserve import KVReserve
from radixflow.runtime.scheduling.logprobs import LogprobCollector
from radixflow.runtime.execution.model_runner import ModelRunner
from radixflow.runtime.scheduling.req import Req, ReqOutput, ReqState, max_request_tokens
from radixflow.runtime.scheduling.sampler import SampleResult, record_sampled, sample
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.scheduling import kv_audit
from radixflow.runtime.scheduling.admission import form_extend_batch
from radixflow.runtime.scheduling.forward_inputs import build_forward_batch, concat_ranges, first_logit_pos, logit_rows_for
from radixflow.runtime.scheduling.extend_overlap import PendingExtend, defers_extends, finish_prompt_only, sample_deferred, tokens_arrived
from radixflow.runtime.scheduling.grammar_wait import poll_grammars, start_grammar_backend
from radixflow.runtime.scheduling.kv_audit import SchedulerStats
from radixflow.runtime.scheduling.jump_policy import decode_rows, jump_limit, jumps_after_sampling
from radixflow.runtime.scheduling.mixed_pass import run_mixed
from radixflow.runtime.scheduling.overlap import InflightDecode, chain_decode, start_decode
from radixflow.runtime.scheduling.split_decode import run_decode_step
from radixflow.runtime.scheduling.stop_checker import StopChecker
from radixflow.runtime.scheduling.replica import ReplicaSync
from radixflow.runtime.distributed.step_channel import agree_ids

log = logging.getLogger(__name__)

NEW_TOKEN_RATIO_INIT, NEW_TOKEN_RATIO_MIN, NEW_TOKEN_RATIO_DECAY = 0.7, 0.1, 0.001


class Scheduler:
    def __init__(
        self, args: ServerArgs, runner: ModelRunner, tokenizer, eos_ids: set, emit_outputs: bool = True,
        continue_request: Optional[Callable[[Req], bool]] = None,
    ):
        """`emit_outputs`: step() returns each touched request's ReqOutput (False: nothing; the
        in-process Engine reads its requests directly). `continue_request` (request graphs): called
        when a request finishes; returns True after appending the next segment's tokens to it (it
        then stays running, its KV kept)."""
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.tree = RadixCache(runner.kv_pool.allocator, args.page_size, disable=args.disable_radix_cache)
        self.kv = KVManager(runner.kv_pool, runner.req_to_token, self.tree)
        self.stops = StopChecker(tokenizer, eos_ids, self.rewind)
        self.logprobs = LogprobCollector(tokenizer)
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Optional[Req] = None  # a request in the middle of a chunked prefill
        self.pending_grammar: list[Req] = []
        self._seq = itertools.count()
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT  # the ratio admission rule's (kv_reserve.py)
        self.reserve = KVReserve(args.admission_rule, max_request_tokens(runner.context_len, runner.kv_pool.allocator.capacity_slots), args.page_size)
        self.stats = SchedulerStats()
        self.grammar_backend = None  # created on the first constrained request
        self.emit_outputs = emit_outputs
        self.jump_forward: Optional[Callable[[Req, bool, Optional[int], bool], object]] = None  # set with the grammar backend
        self.continue_request = continue_request
        self.device = runner.device
        self.overlap = args.overlap_enabled(self.device)
        self.inflight: Optional[InflightDecode] = None
        self.pending_extend: Optional[PendingExtend] = None  # an extend pass's first tokens, not yet read back
        self.replica: Optional[ReplicaSync] = None  # tensor parallelism with a scheduler on every rank

    # -- requests in and out --------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        if self.replica is not None:
            self.replica.record_add(req)
        req.arrival_seq = next(self._seq)
        if req.sampling.repetition_penalty != 1.0:
            mask = torch.zeros(self.runner.vocab_size, dtype=torch.bool, device=self.device)
            mask[torch.tensor(req.origin_input_ids, device=self.device)] = True
            req.prompt_mask = mask
        if req.logprob.return_logprob and req.logprob.logprob_start_len >= 0:
            req.input_logprob_next = req.logprob.logprob_start_len
        if req.sampling.grammar is not None:
            start_grammar_backend(self).submit(req)  # compiles off this loop; the request waits
            req.state = ReqState.GRAMMAR_PENDING
            self.pending_grammar.append(req)
        else:
            req.state = ReqState.WAITING
            self.waiting.append(req)

    def abort(self, rid: str) -> Optional[Req]:
        if self.replica is not None:
            self.replica.record("abort", rid)
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

    def has_work(self) -> bool:  # a pending extend pass may hold prompt-only requests, finished at its read-back
        return bool(self.waiting or self.running or self.chunked or self.pending_grammar or self.pending_extend)

    @property
    def num_running(self) -> int:
        return len(self.running) + (self.chunked is not None)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; only when idle (like SGLang)."""
        if self.replica is not None:
            self.replica.record("flush")
        if self.has_work():
            return False
        self.inflight = self.pending_extend = None  # only finished requests' tokens were in flight
        self.tree.reset()
        self.runner.kv_pool.allocator.clear()
        self.runner.req_to_token.clear()
        return True

    # -- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[ReqOutput]:
        if self.replica is not None and self.replica.leader:
            self.replica.publish_step()  # the other ranks receive it in replica_follower.py
        touched = poll_grammars(self)
        if tokens_arrived(self.pending_extend):  # no need to hold them while the next pass is built
            touched += self._read_back_extend()
        batch = form_extend_batch(self)
        self.kv.req_to_token.flush()  # the admitted rows' copies queue behind the pass in flight, before _drain waits
        if batch and self.args.enable_mixed_chunk and (mixed := run_mixed(self, batch)) is not None:
            return self._outputs(touched + mixed)
        if self.inflight is not None:
            assert self.pending_extend is None, "a pending extend pass is read back before any decode pass"
            chained = None if batch else self._chain_decode()
            if chained is not None:
                self.stats.forward_steps += 1
                return self._outputs(touched + chained)
            if not (batch and defers_extends(self)):
                touched += self._drain()
        if batch:
            self.stats.forward_steps += 1
            touched += self._run_extend(batch)
            if self.inflight is not None:  # the extend pass was launched behind it: this read-back overlaps it
                touched += self._drain()
            return self._outputs(touched)
        if self.running:
            touched += self._decode()
        return self._outputs(touched + self._read_back_extend())

    def _outputs(self, touched: list[Req]) -> list[ReqOutput]:
        return [r.to_output() for r in touched] if self.emit_outputs else []

    # -- extend ----------------------------------------------------------------------------------
    def _run_extend(self, batch: list[tuple[Req, int]]) -> list[Req]:
        ids, rows = [], []
        start = 0
        for req, n in batch:
            ids.extend(req.token_range(req.kv_len, req.kv_len + n))
            rows.append(logit_rows_for(req, n, start))
            start += n
        prefix = [r.kv_len for r, _ in batch]
        ext = [n for _, n in batch]
        locs = self.kv.req_to_token.read_spans([(r.req_pool_idx, r.kv_len, r.kv_len + n) for r, n in batch])
        fb = build_forward_batch(self.device, ForwardMode.EXTEND, ids, concat_ranges(prefix, ext), locs, batch, prefix, ext, rows)
        logits = self.runner.forward(fb)
        self.stats.extend_tokens += len(ids)

        views, offsets, offset = [], [], 0
        for req_rows in rows:
            views.append(logits[offset : offset + len(req_rows)])
            offsets.append(offset)
            offset += len(req_rows)
        items = [(r, at, first_logit_pos(r), len(v)) for (r, _), v, at in zip(batch, views, offsets) if r.needs_input_logprobs]
        deferred = defers_extends(self)
        inputs = self.logprobs.add_inputs(logits, items, defer=deferred)  # None: already applied
        finishing, prompt_only = [], []
        for (req, n), req_logits in zip(batch, views):
            req.kv_len += n
            self.kv.cache_unfinished(req)  # share what is computed so far
            if req.kv_len < req.seq_len:  # more chunks to come
                continue
            if req.sampling.max_new_tokens == 0:
                self._retire(req)
                prompt_only.append(req)
                continue
            finishing.append((req, req_logits[-1:]))
        if inputs is None:  # their logprobs, if any, are in
            finish_prompt_only(prompt_only)
            prompt_only = []
        touched = [r for r, _ in batch if r.finished]
        reqs = [r for r, _ in finishing]
        if (finishing or inputs is not None) and deferred:  # read back by the next step, after it launches its pass
            logits_rows = torch.cat([lg for _, lg in finishing]) if finishing else None
            pending = sample_deferred(self, reqs, logits_rows, inputs, prompt_only)
            self.running += reqs
            prev, self.pending_extend = self.pending_extend, pending  # kept even if reading `prev` back fails
            self.stats.late_extend_read_backs += prev is not None
            return touched + self._advance_pending(prev)  # now that this pass is queued behind it
        touched += self._read_back_extend()
        if finishing:
            self._sample_and_advance(reqs, torch.cat([lg for _, lg in finishing]))
            self.running += [r for r in reqs if not r.finished]
            touched += reqs
        return touched

    def _read_back_extend(self) -> list[Req]:
        """Advance the pending extend pass's requests by their first tokens (aborted ones drop theirs)."""
        pending, self.pending_extend = self.pending_extend, None
        return self._advance_pending(pending)

    def _advance_pending(self, pending: Optional[PendingExtend]) -> list[Req]:
        if pending is None:
            return []
        done = pending.finish_inputs()
        return done + (self._advance_host(pending.reqs, pending.host_ids, pending.ready, pending.result) if pending.reqs else [])

    # -- decode (overlapped passes: overlap.py) --------------------------------------------------
    def _decode(self) -> list[Req]:
        """A decode pass over `running`; a pending extend pass is read back, after launching it where it can."""
        flight, touched = start_decode(self) if self.overlap else (None, [])
        if flight is not None:
            self.inflight = flight
            self.stats.forward_steps += 1
            return touched
        touched = self._read_back_extend()
        if self.running:  # unless all finished at their first token
            self.stats.forward_steps += 1
            touched += self._run_decode()
        return touched

    def _chain_decode(self) -> Optional[list[Req]]:  # a method: tests count its calls
        return chain_decode(self)

    def room_for(self, reqs: list) -> bool:
        """Free or evictable slots for every pending token of `reqs` and one more each, in any page layout."""
        return self.kv.available_slots() >= (sum(r.seq_len - r.kv_len for r in reqs) + len(reqs)) * self.args.page_size

    def decode_launched(self) -> None:
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)

    def _drain(self) -> list[Req]:
        prev, self.inflight = self.inflight, None
        return self.read_back(prev)

    def read_back(self, done: InflightDecode) -> list[Req]:
        """Per-request work for a completed decode pass."""
        reqs = self._advance_host(done.reqs, done.host_ids, done.ready, done.result, done.real)
        self.stats.decode_tokens += len(reqs)
        return reqs

    def _advance_host(self, reqs: list[Req], host_ids: torch.Tensor, ready: Optional[torch.cuda.Event],
                      result: SampleResult, real: Optional[list] = None) -> list[Req]:
        """Wait for a pass's ids to reach the host, advance its requests, drop the finished from `running`."""
        if ready is not None:
            ready.synchronize()
        advanced = self._advance(reqs, host_ids.tolist(), result, real)
        self.running = [r for r in self.running if not r.finished]
        return advanced

    def _run_decode(self) -> list[Req]:
        """One token a running request, read back at once; rows holding several (split_decode) make it an extend."""
        self._make_room_for_decode()
        if not self.running:
            return []
        reqs = list(self.running)
        ext = [r.seq_len - r.kv_len for r in reqs]
        assert min(ext) >= 1, "a running request has no pending token"
        return run_decode_step(self, reqs, ext)

    def _make_room_for_decode(self) -> None:
        """Retract the newest requests until every running request has a slot for its next token."""
        if self.room_for(self.running):
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
        result = self.sample(logits, reqs)
        self._advance(reqs, result.next_ids.tolist(), result)

    def sample(self, logits: torch.Tensor, reqs: list) -> SampleResult:
        result = sample(logits, reqs, self.eos_ids, self.runner.settings)
        if self.replica is not None:
            agree_ids(result.next_ids, self.runner.tp)  # every rank takes rank 0's tokens
        return result

    def _advance(self, reqs: list[Req], next_ids: list, result: SampleResult, real: Optional[list] = None) -> list[Req]:
        """Append each request's sampled token; check stops; retire finished requests.
        A request finished before its token arrived (aborted, or done while an overlapped
        pass computed one token more) drops it, as does a row that only fed a pending
        token (`real` False). Returns the requests advanced."""
        live = [i for i, r in enumerate(reqs) if not r.finished and (real is None or real[i])]
        record_sampled([reqs[i] for i in live], [next_ids[i] for i in live])
        now = time.time()
        for i in live:
            req, tok = reqs[i], next_ids[i]
            req.output_ids.append(tok)
            req.first_token_time = req.first_token_time or now
            if req.logprob.return_logprob:
                self.logprobs.add_output(req, result, i, tok)
        accept_tokens(pairs := [(reqs[i].grammar, next_ids[i]) for i in live if reqs[i].grammar is not None])
        grammars = bool(pairs)  # without overlap the rows do not matter
        forced = not grammars or self.jumps_after_sampling(decode_rows(self.running, reqs) if self.overlap else len(reqs))
        for i in live:
            req, jumps = reqs[i], reqs[i].grammar is not None and self.jump_forward is not None
            self.stops.check(req, self.reserve.seq_limit)  # a length stop waits for a budget repair (the jump's)
            if jumps and not req.finished:
                limit = jump_limit(self.overlap, req.seq_len, req.kv_len)
                self._apply_jump_forward(req, forced or req.grammar.jumps_in_any_batch, limit, cut=forced)
            if req.finished and self.continue_request is not None and self.continue_request(req):
                assert not req.finished, "a continued request must be unfinished"
            if req.finished:
                self._retire(req)
        if grammars and self.grammar_backend is not None:  # auto: rows of a grammar that just moved go on on outlines
            self.stats.grammar_rows_switched += self.grammar_backend.switch_moved(reqs)
        return [reqs[i] for i in live]

    def jumps_after_sampling(self, rows: int) -> bool:
        """Whether a step whose decode batch holds `rows` rows jumps forward after sampling (jump_policy)."""
        return jumps_after_sampling(self.overlap, rows, self.args.jump_forward_max_batch)

    def _apply_jump_forward(self, req: Req, allowed: bool = True, limit: Optional[int] = None, cut: bool = True) -> None:
        """Append tokens the grammar forces, unsampled (`allowed`: the step may jump; `cut`: it may re-tokenize the
        sampled token (jump_policy); a budget repair applies regardless); the next pass computes their KV. The hook
        returns the tokens to append, or (keep, tokens) to cut the output back to `keep` tokens first."""
        forced = self.jump_forward(req, allowed, limit, cut)
        if not forced:
            return
        keep, tokens = jump_parts(forced, len(req.output_ids))
        LogprobCollector.replace_outputs(req, len(req.output_ids) - keep, tokens)
        if keep < len(req.output_ids):
            self.rewind(req, keep)
        req.output_ids.extend(tokens)
        req.jump_forward_tokens += len(tokens)
        self.stops.check(req, self.reserve.seq_limit)

    def rewind(self, req: Req, keep_outputs: int) -> None:
        """Drop outputs past `keep_outputs`, and the KV of dropped tokens."""
        req.cut_outputs(keep_outputs)
        req.stop_text, req.stop_checked, req.output_counts = None, min(req.stop_checked, keep_outputs), None
        new_kv = min(req.kv_len, req.seq_len - 1)
        if new_kv < req.kv_len:
            self.kv.truncate(req, new_kv)

    def _retire(self, req: Req) -> None:
        req.state = ReqState.FINISHED
        self.reserve.finished(req)
        self.kv.release(req, cache=True)

    def token_usage(self) -> float:
        return kv_audit.token_usage(self)

    def check_invariants(self) -> None:
        kv_audit.check_invariants(self)

    def reclaim_unowned_pages(self) -> int:
        return kv_audit.reclaim_unowned_pages(self)
