"""Runs request graphs (see program_ops) inside the scheduler.

A program is a tree of *strands*: the main one and one per fork branch. A strand walks
its ops; text is collected and tokenized as one piece just before the next model call
(segment_tokens has the boundary rule). A gen runs as a request; when it finishes, the
scheduler's `continue_request` hook lets the same request go on: the next text piece's tokens
are appended to it and the next gen's sampling params take over, keeping its KV (no
re-tokenizing, no new admission). select, fork, join and the end of a strand let the
request retire (its KV goes into the radix tree); the strand then goes on from
`on_step`, called after each scheduler step, with new requests that hit that cache
(on_step looks only at runs that something woke: program_runs.py):
select scores all options as one batch of prompt-only requests sharing the prefix, and
fork branches start as child requests whose prompt begins with the parent's tokens, and
a gen with n > 1 runs as n such requests. A run given `on_delta` streams its main
strand's text (program_stream.py).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Callable, Optional, Union

from radixflow.errors import RadixflowError
from radixflow.runtime.programs.choice_scoring import score_choices
from radixflow.runtime.programs.gen_logprobs import GenLogprobs
from radixflow.runtime.programs.program_meta import request_facts, request_meta, run_meta, segment_tokens
from radixflow.runtime.programs.program_ops import Op, joined_names, parse_program
from radixflow.runtime.programs.program_stream import OnDelta, StrandStream
from radixflow.runtime.programs.program_runs import DONE, GEN, JOIN, RUNNABLE, SAMPLES, SELECT, ProgramRun, Strand, Wakeups
from radixflow.runtime.programs.request_segments import common_prefix, continuable, continues_after, start_segment
from radixflow.runtime.scheduling.req import LogprobOptions, Req, over_limit
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.programs.segment_tokens import encode_piece, gen_piece

_PREFILL_ONLY = SamplingParams.from_dict({"max_new_tokens": 0})


class ProgramExecutor:
    def __init__(self, scheduler, tokenizer):
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.runs: dict[ProgramRun, None] = {}  # unfinished runs, in submission order
        self.by_rid: dict[str, Strand] = {}
        self._ids = itertools.count()
        self._runs_made = itertools.count()
        self._wakeups = Wakeups()

    # -- public ------------------------------------------------------------------------------
    def submit(
        self, program: dict, on_done: Optional[Callable[[dict], None]] = None, on_delta: Optional[OnDelta] = None,
        pieces: Optional[dict] = None, ops: Optional[list[Op]] = None,
    ) -> ProgramRun:  # fmt: skip
        """`pieces`: its text pieces tokenized ahead (text_pieces.constant_pieces), and `ops` its
        parsed ops (program_ops.parse_program), if the caller has them."""
        ops = parse_program(program) if ops is None else ops  # raises RadixflowError before anything runs
        rid = program.get("rid") or uuid.uuid4().hex
        run = ProgramRun(rid=str(rid), on_done=on_done, pieces=pieces or {}, seq=next(self._runs_made))
        stream = None if on_delta is None else StrandStream(on_delta, self.tokenizer)
        run.strands.append(Strand(run, ops, ids=[], vars={}, stream=stream))
        self.runs[run] = None
        self._wakeups.add(run, streamed=stream is not None)
        return run

    def has_work(self) -> bool:
        return bool(self.runs)

    def on_step(self) -> None:
        """Advance the strands of woken runs (a request of theirs finished, they were submitted or
        failed) and of streamed ones; finish programs that are done. A run nothing woke has nothing
        to advance: each of its strands waits for a request that has not finished, or for a join."""
        for run in self._wakeups.take():
            if run.finished:  # by an on_done callback that aborted it (a nested on_step)
                continue
            changed = True
            while changed and run.error is None:
                try:
                    changed = any([self._poll(st) for st in list(run.strands)])
                except RadixflowError as e:
                    run.fail(str(e))
            if run.error is not None or all(st.state == DONE for st in run.strands):
                self._finish_run(run)
            else:
                _stream_progress(run.strands[0])

    def abort(self, rid: Optional[str]) -> bool:
        """Stop the program `rid` (None: every program) and free its requests' KV now."""
        hit = [run for run in self.runs if rid is None or run.rid == rid]
        for run in hit:
            run.fail("aborted by request", status_code=200)
        if hit:
            self.on_step()
        return bool(hit)

    # -- the scheduler hook ------------------------------------------------------------------------
    def continue_request(self, req: Req) -> bool:
        st = self.by_rid.get(req.rid)
        if st is None or st.req is not req:
            return False
        try:
            return self._continue(st, req)
        except RadixflowError as e:  # the program's own fault, met once a gen ended (a var no gen set, ...)
            st.run.fail(str(e))
            return False
        except Exception as e:  # never break the scheduler loop
            st.run.fail(f"{type(e).__name__}: {e}", status_code=500)
            return False

    def _continue(self, st: Strand, req: Req) -> bool:
        op = st.ops[st.pc]
        if req.finish_reason.get("type") == "abort":
            _fail_from(st.run, f"gen {op.name!r}", req.finish_reason)
            return False
        self._finish_gen(st, req, op)
        self._take_text(st)
        nxt = st.ops[st.pc] if st.pc < len(st.ops) else None
        if req.continuable and nxt is not None and nxt.kind == "gen" and continuable(nxt.sampling):
            tokens = self._encode(st, st.pending, first=False)
            if req.seq_len + len(tokens) < self.scheduler.reserve.seq_limit:
                st.pending = ""
                start_segment(req, tokens, nxt.sampling, self.scheduler.stats)
                req.continuable = continues_after(st.ops, st.pc)  # the last segment overlaps its decode passes
                st.logprobs = GenLogprobs.begin(req, nxt.logprob, self.scheduler.logprobs.with_text)
                st.run.segments += 1
                return True
        st.ids = req.fill_ids  # a new list
        self._release(st)
        return False

    def _finish_gen(self, st: Strand, req: Req, op: Op) -> None:
        seg, counts = req.output_ids[req.segment_start :], segment_tokens(req)  # the counts before the trim below
        lp, n = st.logprobs, len(seg)
        sp = req.sampling
        text, kept = gen_piece(self.tokenizer, seg, req.finish_reason, sp.skip_special_tokens, sp.no_stop_trim)
        same = common_prefix(seg, kept)
        if same < len(seg):
            self.scheduler.rewind(req, req.segment_start + same)
        req.output_ids.extend(kept[same:])
        meta = {
            **counts,
            "cached_tokens": req.cached_tokens if req.segment_start == 0 else req.seq_len - len(kept),
            "finish_reason": req.finish_reason,
            **request_facts(req),
            **({} if lp is None else lp.meta(req)),
        }
        self._record(st, op, text, meta)
        self._appended(st, op.name, text, streamed=True, chunk=lambda: meta if lp is None else {**meta, **lp.chunk(req, n)})
        st.pc += 1

    def _record(self, st: Strand, op: Op, value: Union[str, list], meta: Union[dict, list]) -> None:
        st.run.results[str(op.id)] = {"text": value, "meta_info": meta}
        if op.name is not None:
            st.vars[op.name] = value
            st.produced.append(op.name)

    def _appended(self, st: Strand, var: Optional[str], text: str, streamed: bool = False,
                  chunk: Optional[Callable[[], dict]] = None, meta: Optional[dict] = None) -> None:
        """Text that joined the strand (not constant text: _take_text sends that); a stream's chunk carries the
        gen's meta_info (`chunk()`), or a select's (`meta`), as eager mode's and SGLang's do."""
        st.text += text
        if st.stream is not None:
            st.stream.finished(var, text, chunk) if streamed else st.stream.text(var, text, meta)

    def _release(self, st: Strand) -> None:
        if st.req is not None:
            self.by_rid.pop(st.req.rid, None)
        st.req = None
        st.state = RUNNABLE

    # -- walking ops -------------------------------------------------------------------------------
    def _poll(self, st: Strand) -> bool:
        """One look at a strand; True if its state changed."""
        before = (st.state, st.pc)
        if st.state == RUNNABLE:
            self._advance(st)
        elif st.state == GEN and st.req.finished:  # finished without the hook: aborted or rejected
            _fail_from(st.run, f"gen {st.ops[st.pc].name!r}", st.req.finish_reason or {})
        elif st.state == SAMPLES and all(r.finished for r in st.samples):
            self._finish_samples(st)
            self._advance(st)
        elif st.state == SELECT and all(r.finished for r in st.choice[0] + st.choice[1]):
            self._finish_select(st)
            self._advance(st)
        elif st.state == JOIN:
            self._advance(st)
        return (st.state, st.pc) != before

    def _advance(self, st: Strand) -> None:
        st.state = RUNNABLE
        while st.run.error is None:
            self._take_text(st)
            if st.pc == len(st.ops):
                self._flush(st)
                st.state = DONE
                return
            op = st.ops[st.pc]
            if op.kind == "gen":
                return self._start_gen(st, op)
            if op.kind == "select":
                return self._start_select(st, op)
            if op.kind == "fork":
                self._fork(st, op)
            elif not self._join(st, op):
                st.state = JOIN
                return
            st.pc += 1

    def _take_text(self, st: Strand) -> None:
        while st.pc < len(st.ops) and st.ops[st.pc].kind in ("text", "var"):
            op = st.ops[st.pc]
            if op.kind == "text":
                text = op.text
            elif op.name in st.vars:
                text = str(st.vars[op.name])
            else:
                raise RadixflowError(f"variable {op.name!r} is used before any gen or select sets it")
            st.pending += text
            self._appended(st, None, text)
            st.pc += 1

    def _flush(self, st: Strand) -> list[int]:
        if st.pending:
            st.ids.extend(self._encode(st, st.pending, first=not st.ids))
            st.pending = ""
        return st.ids

    def _encode(self, st: Strand, text: str, first: bool) -> list[int]:
        ids = st.run.pieces.get((text, first))
        return encode_piece(self.tokenizer, text, first) if ids is None else ids

    def _new_req(self, st: Strand, ids: list, sampling: SamplingParams, logprob: Optional[LogprobOptions] = None,
                 continues: bool = False) -> Req:  # fmt: skip
        if not ids:
            raise RadixflowError("a program must have some text before its first gen or select")
        limit = over_limit(len(ids), self.scheduler.runner.context_len, self.scheduler.runner.kv_pool.allocator.capacity_slots)
        if limit:
            raise RadixflowError(f"the program reached {len(ids)} tokens but {limit}; shorten its text")
        req = Req(rid=f"{st.run.rid}-{next(self._ids)}", origin_input_ids=list(ids), sampling=sampling, continuable=continues,
                  streamed=st.stream is not None, on_finish=st.run.woken)
        if logprob is not None:
            req.logprob = logprob
        self.scheduler.add_request(req)
        st.run.reqs.append(req)
        return req

    def _start_gen(self, st: Strand, op: Op) -> None:
        ids, sp = self._flush(st), op.sampling
        if sp.n > 1 or sp.max_new_tokens == 0:  # samples, or a prefill only, which ends without the scheduler's hook
            st.samples = [self._new_req(st, ids, sp.sample(j) if sp.n > 1 else sp, op.logprob) for j in range(sp.n)]
            st.state = SAMPLES
            return
        st.req = self._new_req(st, ids, sp, op.logprob, continues=continues_after(st.ops, st.pc))
        st.logprobs = GenLogprobs.begin(st.req, op.logprob, self.scheduler.logprobs.with_text)
        self.by_rid[st.req.rid] = st
        st.state = GEN

    def _finish_samples(self, st: Strand) -> None:
        """n > 1: the variable holds every sample, the sequence goes on with the first (n = 1: a prefill only)."""
        op = st.ops[st.pc]
        bad = [r for r in st.samples if (r.finish_reason or {}).get("type") == "abort"]
        if bad:
            _fail_from(st.run, f"gen {op.name!r}", bad[0].finish_reason)
            return
        pieces = [gen_piece(self.tokenizer, r.output_ids, r.finish_reason, r.sampling.skip_special_tokens,
                            r.sampling.no_stop_trim) for r in st.samples]  # fmt: skip
        texts = [text for text, _ in pieces]
        lp = None if op.logprob is None else GenLogprobs(op.logprob, 0, 0, self.scheduler.logprobs.with_text)
        metas = [{**request_meta(r), **({} if lp is None else lp.meta(r))} for r in st.samples]
        self._record(st, op, texts if op.sampling.n > 1 else texts[0], metas if op.sampling.n > 1 else metas[0])
        st.ids.extend(pieces[0][1])
        first = st.samples[0]
        self._appended(st, op.name, texts[0], streamed=True,
                       chunk=lambda: metas[0] if lp is None else {**metas[0], **lp.chunk(first)})
        st.samples = []
        st.pc += 1

    # -- select ---------------------------------------------------------------------------------------
    def _start_select(self, st: Strand, op: Op) -> None:
        prefix = self._flush(st)
        if not prefix:  # nothing to score the choices after: every choice would score 0 (found by fuzzing)
            raise RadixflowError("a program must have some text before its first gen or select")
        cids = [self._encode(st, c, first=False) for c in op.choices]
        cond = [self._new_req(st, prefix + c, _PREFILL_ONLY, LogprobOptions(True, len(prefix))) for c in cids]
        uncond = []
        if op.method == "unconditional_likelihood_normalized":
            uncond = [self._new_req(st, c, _PREFILL_ONLY, LogprobOptions(True, 0)) for c in cids]
        st.choice = [cond, uncond, cids]
        st.state = SELECT

    def _finish_select(self, st: Strand) -> None:
        cond_reqs, uncond_reqs, cids = st.choice
        op = st.ops[st.pc]
        bad = [r for r in cond_reqs + uncond_reqs if (r.finish_reason or {}).get("type") == "abort"]
        if bad:
            _fail_from(st.run, f"select {op.name!r}", bad[0].finish_reason)
            return
        best, meta = score_choices(op.method, [r.input_token_logprobs for r in cond_reqs],
                                   [r.input_token_logprobs for r in uncond_reqs], cids)
        st.ids.extend(cids[best])
        self._record(st, op, op.choices[best], meta)
        self._appended(st, op.name, op.choices[best], meta=meta)
        st.choice = []
        st.pc += 1

    # -- fork / join ----------------------------------------------------------------------------------
    def _fork(self, st: Strand, op: Op) -> None:
        base = list(self._flush(st))
        kids = [Strand(st.run, branch, ids=list(base), vars=dict(st.vars)) for branch in op.branches]
        st.children[op.id] = kids
        st.fork_base[op.id] = len(base)
        st.run.strands.extend(kids)
        for kid in kids:
            self._advance(kid)

    def _join(self, st: Strand, op: Op) -> bool:
        kids = st.children[op.fork]
        if not all(k.state == DONE for k in kids):
            return False
        for name, having in joined_names(st.vars, kids):  # new branch variables -> lists
            st.vars[name] = [k.vars[name] for k in having]
            st.produced.append(name)
        if op.mode == "concat":
            self._flush(st)
            base = st.fork_base[op.fork]
            for k in kids:
                st.ids.extend(k.ids[base:])
                self._appended(st, None, k.text)
        return True

    # -- finishing ------------------------------------------------------------------------------------
    def _finish_run(self, run: ProgramRun) -> None:
        for st in run.strands:
            if st.req is not None:
                self.by_rid.pop(st.req.rid, None)
        for req in run.reqs:
            if not req.finished:
                self.scheduler.abort(req.rid)
            req.on_finish = None  # req -> run -> req: a cycle only a full collection would free
        del self.runs[run]
        self._wakeups.drop(run)
        run.output = {"results": run.results, "meta_info": run_meta(run), "error": run.error,
                      "status_code": run.status_code}  # fmt: skip
        run.strands = []  # each strand points back to its run: left as a cycle, a full collection frees them
        if run.on_done is not None:
            run.on_done(run.output)


def _fail_from(run: ProgramRun, what: str, reason: dict) -> None:
    """Fail a run because one of its requests was aborted or rejected (keeping its status)."""
    run.fail(f"{what}: {reason.get('message', reason.get('type'))}", reason.get("status_code", 200))


def _stream_progress(st: Strand) -> None:
    if st.stream is not None and st.state == GEN and not st.req.finished:
        st.stream.progress(st.req, st.ops[st.pc].name, st.logprobs)
