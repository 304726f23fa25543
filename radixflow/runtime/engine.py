"""In-process engine, shaped like SGLang's `Engine`: no HTTP, no extra processes.

    with radixflow.Engine() as engine:                 # the embedded default model
        out = engine.generate("The capital of France is", {"max_new_tokens": 8})
        print(out["text"], out["meta_info"]["cached_tokens"])
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Optional, Union

from radixflow.errors import RadixflowError, ServerBusyError
from radixflow.runtime import sglang_fields
from radixflow.runtime.async_threads import in_thread, iterate_in_thread
from radixflow.runtime.engine_stepper import AllFinished, EngineStepper
from radixflow.runtime.build import build_runtime
from radixflow.runtime.distributed.tp_launch import TPRankFailed
from radixflow.runtime.gc_freeze import EngineFreeze
from radixflow.runtime.generate_request import GenerateInput, RequestBuilder, build_result, output_text
from radixflow.runtime.incremental_text import StreamText
from radixflow.runtime.output_delta import Assembly, Sent, as_delta
from radixflow.runtime.scheduling.req import Req
from radixflow.runtime.server_args import ServerArgs

log = logging.getLogger(__name__)
_GENERATE_ARGS = {"prompt", "sampling_params", "input_ids", "return_logprob", "logprob_start_len", "top_logprobs_num",
                  "stream", "rid", "return_text_in_logprobs", "token_ids_logprob"}  # fmt: skip


class Engine:
    def __init__(self, model_path: Optional[str] = None, **server_args: Any):
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, **server_args)
        if self.server_args.dp_size > 1:
            raise RadixflowError(
                "dp_size > 1 is for `radixflow serve` (replicas behind a router); an Engine is one replica"
            )
        rt = build_runtime(self.server_args, emit_outputs=False)  # reads each Req directly instead
        self.tp, self.runner, self.tokenizer, self.eos_ids = rt.tp, rt.runner, rt.tokenizer, rt.eos_ids
        self.scheduler, self.programs = rt.scheduler, rt.programs
        self.stepper = EngineStepper(self.scheduler, self.programs)
        self.builder = RequestBuilder(
            self.tokenizer,
            self.runner.vocab_size,
            self.runner.context_len,
            self.runner.kv_pool.allocator.capacity_slots,
            self.server_args.max_new_tokens_limit,
            self.server_args.grammar_backend,
        )
        self.lang_backend = None  # the DSL's backend for this Engine, made on first use (radixflow.lang)
        self._closed = False
        self._gc = EngineFreeze(enabled=not self.server_args.disable_gc_freeze)
        # given back by shutdown() or, if the Engine is dropped without one, when it is freed
        self._gc_release = weakref.finalize(self, self._gc.release)
        self._gc.freeze("start-up")

    # -- generation ---------------------------------------------------------------------------
    def generate(
        self,
        prompt: Union[str, list, None] = None,
        sampling_params: Union[dict, list, None] = None,
        input_ids: Optional[list] = None,
        return_logprob: Union[bool, list] = False,
        logprob_start_len: Union[int, list, None] = None,
        top_logprobs_num: Union[int, list] = 0,
        stream: bool = False,
        rid: Union[str, list, None] = None,
        return_text_in_logprobs: bool = True,
        token_ids_logprob: Optional[list] = None,
        **sglang_extras: Any,
    ) -> Union[dict, list, Iterator]:
        """A dict for one prompt, a list of dicts for a batch (prompt-major when n > 1);
        with stream=True an iterator of growing results. `sglang_extras`: SGLang's other
        generate fields, accepted at values that change nothing (runtime/sglang_fields.py)."""
        g = _generate_input(prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num,
                            stream, rid, return_text_in_logprobs, token_ids_logprob, **sglang_extras)
        reqs, single = self._build(g)
        if stream:
            return self._stream(reqs, single)
        self._run(reqs)
        return self._results(reqs, single)

    async def async_generate(self, *args: Any, **kwargs: Any) -> Union[dict, list, AsyncIterator]:
        """SGLang's: generate() awaited, its wait on a worker thread, so one event loop can have many in flight
        (their requests share the scheduler's steps); with stream=True an async iterator of growing results
        (`async for out in await engine.async_generate(..., stream=True)`). Same arguments. Cancelled, or a stream
        dropped early, it aborts its requests."""
        g = _generate_input(*args, **kwargs)
        reqs, single = await in_thread(lambda: self._build(g))  # bad input raises here, before anything runs
        if g.stream:
            return iterate_in_thread(self._stream(reqs, single))
        cancelled = threading.Event()

        def run() -> Union[dict, list]:
            self._submit(reqs)
            if cancelled.is_set():  # cancelled before they were queued: the abort below found nothing
                self._abort(reqs)
            self._wait(reqs)
            return self._results(reqs, single)

        try:
            return await in_thread(run)
        except asyncio.CancelledError:
            cancelled.set()
            await asyncio.shield(in_thread(lambda: self._abort(reqs)))  # off the event loop; the wait then ends
            raise

    def _build(self, g: GenerateInput) -> tuple[list[Req], bool]:
        reqs = self.builder.build(g)  # raises before anything is queued
        return reqs, not g.is_batch and len(reqs) == 1

    def _results(self, reqs: list[Req], single: bool) -> Union[dict, list]:
        results = [self._result(r) for r in reqs]
        return results[0] if single else results

    def _submit(self, reqs: list[Req]) -> None:
        self._check_open()
        add = self.scheduler.add_request
        self.stepper.call(lambda: [add(r) for r in reqs])

    def _abort(self, reqs: list[Req]) -> None:
        abort = self.scheduler.abort
        self.stepper.exclusive(lambda: [abort(r.rid) for r in reqs if not r.finished])

    def _run(self, reqs: list[Req]) -> None:
        """Run reqs; requests other threads are waiting for share the same steps."""
        self._submit(reqs)
        self._wait(reqs)

    def _wait(self, reqs: list[Req]) -> None:
        try:
            self.stepper.run_until(AllFinished(reqs))
        except BaseException as e:
            self._abort(reqs)
            self._raise_if_tp_failed(e)
            raise
        for r in reqs:
            _raise_if_refused(r.finish_reason or {})

    def _stream(self, reqs: list[Req], single: bool) -> Iterator:
        self._submit(reqs)
        sent = [-1] * len(reqs)
        views = [_StreamView.of(r, self.scheduler.logprobs.with_text) for r in reqs]
        all_done = AllFinished(reqs)
        try:
            while True:
                self.stepper.advance(all_done)
                for i, r in enumerate(reqs):
                    if r.finished:
                        _raise_if_refused(r.finish_reason or {})
                    if sent[i] != -2 and (len(r.output_ids) != sent[i] or r.finished):  # -2: its last sent
                        sent[i] = -2 if r.finished else len(r.output_ids)
                        out = self._result(r, finished=r.finished, view=views[i])
                        if not single:
                            out["index"] = i
                        yield out
                if all(s == -2 for s in sent):
                    return
        finally:
            if not all_done():
                self._abort(reqs)

    def _result(self, req: Req, finished: bool = True, view: Optional["_StreamView"] = None) -> dict:
        """The request's result; for a stream (`view`), its text so far decoded a window at a time (a stop string's
        possible beginning held back, as the server's streams do) and its lists from the view's deltas."""
        sp, out, cut = req.sampling, req.to_output(), False
        if view is None:  # the whole lists, each logprob given its text
            out = Assembly.with_texts(self.scheduler.logprobs.with_text, req.logprob).apply(out)
        else:
            cut = out.cuts != view.sent.cuts  # outputs cut back since the last yield: their text is decoded again
            out = view.lists.apply(as_delta(out, view.sent))
        if finished or view is None:
            text = output_text(self.tokenizer, out.output_ids, req.finish_reason, sp.skip_special_tokens, sp.no_stop_trim)
        else:
            text = view.text.shown(self.tokenizer, out.output_ids, restart=cut)
        return build_result(out, text, req.logprob, finished, time.time() - req.created)

    # -- programs, cache, lifecycle -------------------------------------------------------------------
    def run_program(self, program: Union[dict, list], stream: bool = False) -> Union[dict, list, Iterator[dict]]:
        """Run request graph(s) (format: runtime/programs/program_ops.py) inside the scheduler,
        batched with whatever other threads are running on this Engine. Raises
        RadixflowError for what /program answers with a 400. With stream=True (one
        program): an iterator of {"var", "text"} deltas of its main strand, then its result."""
        from radixflow.runtime.programs.program_engine import run_programs, stream_program
        from radixflow.runtime.programs.program_ops import check_programs

        self._check_open()
        programs = program if isinstance(program, list) else [program]
        if stream and len(programs) != 1:
            raise RadixflowError("run_program(stream=True) takes one program")
        ops = check_programs(programs, self.builder.sampling, max_requests=None)  # like generate: no per-call limit
        if stream:
            return self._program_stream(stream_program(self, programs[0], ops[0]))
        outs = [_raise_if_rejected(out) for out in run_programs(self, programs, ops)]
        return outs if isinstance(program, list) else outs[0]

    def run_programs_apart(self, programs: list, ops: Optional[list] = None, pieces: Optional[list] = None) -> list:
        """run_program for a batch whose programs fail apart (the DSL's run_batch): each program's output, or the
        RadixflowError / ServerBusyError that refused it, before running (its parameters) or while running (e.g. a
        prompt over the context); the others run. `ops` / `pieces`: what a program template checked and tokenized
        before (program_ops.check_programs with this Engine's builder, text_pieces.constant_pieces)."""
        from radixflow.runtime.programs.program_engine import run_programs
        from radixflow.runtime.programs.program_ops import check_programs

        self._check_open()
        results: list = [None] * len(programs)
        if ops is None:
            ops = [None] * len(programs)
            for i, program in enumerate(programs):
                try:
                    ops[i] = check_programs([program], self.builder.sampling, max_requests=None)[0]
                except RadixflowError as e:
                    results[i] = e
        run = [i for i, r in enumerate(results) if r is None]
        outs = run_programs(self, [programs[i] for i in run], [ops[i] for i in run],
                            pieces=None if pieces is None else [pieces[i] for i in run])  # fmt: skip
        for i, out in zip(run, outs):
            try:
                results[i] = _raise_if_rejected(out)
            except (RadixflowError, ServerBusyError) as e:
                results[i] = e
        return results

    @staticmethod
    def _program_stream(events: Iterator[dict]) -> Iterator[dict]:
        for event in events:
            yield _raise_if_rejected(event) if "results" in event else event

    def flush_cache(self) -> bool:
        return self.stepper.exclusive(self.scheduler.flush_cache)

    def get_server_info(self) -> dict:
        return self.stepper.exclusive(self._server_info)

    def _server_info(self) -> dict:
        s = self.scheduler
        return {
            "max_total_num_tokens": self.runner.kv_pool.allocator.capacity_slots,
            "free_slots": self.runner.kv_pool.allocator.num_free_slots,
            "cached_slots": s.tree.total_size,
            "cache_hit_rate": s.stats.cache_hit_rate,
            "num_retractions": s.stats.retractions,
            "grammar_rows_switched": s.stats.grammar_rows_switched,
        }

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Engine was shut down; create a new one")
        if self.tp is not None:
            self.tp.check()

    def _raise_if_tp_failed(self, err: BaseException) -> None:
        if self.tp is None or isinstance(err, TPRankFailed) or not isinstance(err, RuntimeError):
            return
        failure = self.tp.wait_failure(timeout=2.0)  # a collective can fail before the monitor looks
        if failure:
            raise TPRankFailed(failure) from err

    def freeze_gc(self) -> int:
        """As SGLang's freeze_gc: call after warm-up requests, so that full garbage collections,
        which pause a step, walk only what was made since. Returns how many objects it froze: 0
        (logged at info level) while another Engine is alive or holds the process's freeze, or
        with disable_gc_freeze. Dead reference cycles among the frozen objects are kept until
        shutdown (runtime/gc_freeze.py)."""
        self._check_open()
        return self._gc.freeze("freeze_gc")

    def shutdown(self) -> None:
        self._gc_release()  # first: frozen cycles that hold graph state can then go in release_cuda_graphs' collection
        if self.tp is not None and not self._closed:
            self.runner.release_cuda_graphs()  # graphs hold NCCL work; drop them before the group
            self.tp.shutdown()
        self._closed = True
        if self.runner is not None:
            self._release_device_memory()
        self.stepper.close()
        self.scheduler = None  # type: ignore[assignment]
        self.runner = None  # type: ignore[assignment]

    def _release_device_memory(self) -> None:
        """A frozen cycle (someone else's freeze is kept) or a caller's reference may keep the runner
        after shutdown: not its KV pool, req_to_token table, attention buffers, graphs or weights.
        Between steps, so that another thread's request still in flight fails at its next step, not
        inside one."""
        try:
            self.stepper.exclusive(self.runner.release_device_memory)
        except Exception:  # the step loop failed (a TP rank, a step's error): nothing steps now
            log.debug("releasing device memory outside the step loop", exc_info=True)
            self.runner.release_device_memory()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


@dataclass
class _StreamView:
    """One request of a stream as its caller sees it: its lists put back together from deltas (output_delta), each
    logprob's text added once, and its text decoded a window at a time. A late yield no longer converts or decodes
    everything so far; each result still copies the lists (top-5 logprobs: 19 us a yield early, 23 us after 2,000
    tokens, on the CPU: BENCHMARKS.md)."""

    lists: Assembly
    text: StreamText
    sent: Sent = field(default_factory=Sent)

    @classmethod
    def of(cls, req: Req, with_text) -> "_StreamView":
        sp = req.sampling
        return cls(Assembly.with_texts(with_text, req.logprob), StreamText(sp.skip_special_tokens, sp.cut_strs))


def _raise_if_rejected(out: dict) -> dict:
    """A program's output, or its 400 / 503 (found while running) raised as the HTTP API answers it."""
    _raise_if_refused({"status_code": out.pop("status_code", 200), "message": out.get("error")})
    return out


def _generate_input(prompt: Union[str, list, None] = None, sampling_params: Union[dict, list, None] = None,
                    input_ids: Optional[list] = None, return_logprob: Union[bool, list] = False,
                    logprob_start_len: Union[int, list, None] = None, top_logprobs_num: Union[int, list] = 0,
                    stream: bool = False, rid: Union[str, list, None] = None, return_text_in_logprobs: bool = True,
                    token_ids_logprob: Optional[list] = None, **sglang_extras: Any) -> GenerateInput:
    """Engine.generate's arguments (async_generate's too) as one request."""
    sglang_fields.check_fields(sglang_extras, _GENERATE_ARGS, sglang_fields.GENERATE, "Engine.generate")
    return GenerateInput(text=prompt, input_ids=input_ids, sampling_params=sampling_params, rid=rid,
                         return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                         top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
                         stream=stream, token_ids_logprob=token_ids_logprob)


def _raise_if_refused(reason: dict) -> None:
    """Where the HTTP API answers 400 (bad input found while running, e.g. a grammar that cannot
    fit max_new_tokens) raise RadixflowError; where it answers 503 (e.g. the grammar compile
    workers busy past the queue bound) raise ServerBusyError. Other finishes are results."""
    status = reason.get("status_code", 200)
    if status == 400:
        raise RadixflowError(reason.get("message") or "request rejected")
    if status == 503:
        raise ServerBusyError(reason.get("message") or "the engine is busy; retry later")
