"""Programs on an in-process Engine. The Engine is safe to call from many threads: the
requests of concurrent eager programs share its scheduler steps (runtime/engine_stepper.py),
and request graphs of a whole batch run together in its scheduler."""

from __future__ import annotations

from typing import Callable, Iterator, Optional

from radixflow.lang.backends.base import NativeBackend


class EngineBackend(NativeBackend):
    streams_graphs = True

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer

    @classmethod
    def for_engine(cls, engine) -> "EngineBackend":
        """One backend per Engine, kept in the slot the Engine declares for it."""
        if engine.lang_backend is None:
            engine.lang_backend = cls(engine)
        return engine.lang_backend

    @staticmethod
    def _args(payload: dict) -> dict:
        """Engine.generate's arguments for a /generate payload, with /generate's default of no text in logprobs
        (Engine.generate's is text; a gen's logprobs then differed between this backend and a server's)."""
        args = {"return_text_in_logprobs": False, **payload}
        if "text" in args:
            args["prompt"] = args.pop("text")
        return args

    def _call(self, payload: dict):
        return self.engine.generate(**self._args(payload))

    def _call_stream(self, payload: dict) -> Iterator[dict]:
        yield from self.engine.generate(stream=True, **self._args(payload))

    def run_graphs(self, programs: list, on_result: Optional[Callable[[int, dict], None]] = None) -> list:
        return _reported(self.engine.run_programs_apart(list(programs)), on_result)

    # -- request graphs checked ahead (a program template's: lang/trace_templates.py) ------------------
    def prepare_graphs(self, programs: list) -> list:
        """Each program's parsed ops, checked as run_program checks them; raises RadixflowError."""
        from radixflow.runtime.programs.program_ops import check_programs

        return check_programs(programs, self.engine.builder.sampling, max_requests=None)

    def constant_pieces(self, ops: list, known: Optional[dict] = None) -> dict:
        from radixflow.runtime.programs.text_pieces import constant_pieces

        return constant_pieces(self.engine.tokenizer, ops, known)

    def run_prepared(self, prepared: list, on_result: Optional[Callable[[int, dict], None]] = None) -> list:
        """run_graphs for trace_templates.Prepared programs: not parsed or checked again."""
        outs = self.engine.run_programs_apart([p.program for p in prepared], [p.ops for p in prepared],
                                              [p.pieces for p in prepared])  # fmt: skip
        return _reported(outs, on_result)

    def run_graph_stream(self, program: dict) -> Iterator[dict]:
        yield from self.engine.run_program(program, stream=True)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()


def _reported(outs: list, on_result: Optional[Callable[[int, dict], None]]) -> list:
    """Each output, as a backend's run_graphs gives it: a program the Engine refused as {"error": message}."""
    outs = [{"error": str(out)} if isinstance(out, Exception) else out for out in outs]
    if on_result is not None:
        for i, out in enumerate(outs):
            on_result(i, out)
    return outs
