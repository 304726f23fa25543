"""The detokenizer process: turns output token ids into text.

Streaming requests are decoded incrementally (only the tokens since the last
confirmed boundary are decoded each time); text that may still change is held back:
an incomplete UTF-8 character, or a tail that could be the start of a stop string.
Finished requests get the full decode with stop trimming, exactly like the
in-process Engine's results. Text is cumulative, like SGLang's default stream.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass, field

import zmq

from radixflow.runtime.generate_request import output_text
from radixflow.runtime.incremental_text import StreamText
from radixflow.runtime.scheduling.req import ReqOutput
from radixflow.runtime.server.server_messages import (
    ControlReply,
    DecodeParams,
    DetokBatch,
    IpcNames,
    NewRequests,
    OutputBatch,
    ProgramDelta,
    StatsSnapshot,
)

log = logging.getLogger("radixflow.detokenizer")
POLL_MS = 500


@dataclass
class DecodeState:
    params: DecodeParams
    text: StreamText
    ids: list = field(default_factory=list)  # a stream's output ids, from its reports' deltas (output_delta.py)

    @classmethod
    def of(cls, params: DecodeParams) -> "DecodeState":
        return cls(params, StreamText(params.skip_special_tokens, params.cut_strs))

    def ids_of(self, out: ReqOutput) -> tuple[list, bool]:
        """The request's whole output ids so far, and whether its outputs were cut back since the last report."""
        if out.starts is None:
            return out.output_ids, False
        cut = out.starts[0] < len(self.ids)
        del self.ids[out.starts[0] :]
        self.ids.extend(out.output_ids)
        return self.ids, cut


@dataclass
class Detokenizer:
    tokenizer: object
    states: dict = field(default_factory=dict)

    def register(self, params: dict) -> None:
        for rid, p in params.items():
            self.states[rid] = DecodeState.of(p)

    def text_of(self, out: ReqOutput) -> str:
        st = self.states.get(out.rid) or DecodeState.of(DecodeParams())
        ids, cut = st.ids_of(out)
        if out.finished:
            self.states.pop(out.rid, None)
            p = st.params
            return output_text(self.tokenizer, ids, out.finish_reason, p.skip_special_tokens, p.no_stop_trim)
        self.states[out.rid] = st
        return st.text.shown(self.tokenizer, ids, restart=cut)


def run_detokenizer_process(tokenizer_path: str, ipc: IpcNames, parent_pid: int, log_level: str = "info") -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), format="[%(asctime)s detokenizer] %(message)s")
    from radixflow.model_files import load_tokenizer

    detok = Detokenizer(load_tokenizer(tokenizer_path))
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(ipc.detokenizer)
    push = ctx.socket(zmq.PUSH)
    push.connect(ipc.tokenizer)
    while True:
        if not pull.poll(POLL_MS):
            if os.getppid() != parent_pid:
                os._exit(1)
            continue
        msg = pull.recv_pyobj()
        reply = _handle(detok, msg)
        if reply is not None:
            push.send_pyobj(reply)


def _handle(detok: Detokenizer, msg):
    if isinstance(msg, NewRequests):
        detok.register(msg.params)
        return None
    if isinstance(msg, OutputBatch):
        texts = []
        for out in msg.outputs:
            try:
                texts.append(detok.text_of(out))
            except Exception as e:  # fail this request (its caller gets the error and the scheduler an abort), keep
                log.exception("decoding %s failed", out.rid)  # going; `finished` stays the scheduler's: its rid is
                out.error = f"internal error while decoding: {type(e).__name__}: {e}"  # in use until its last report
                texts.append("")
        return DetokBatch(msg.outputs, texts, msg.stats)
    if isinstance(msg, (ControlReply, StatsSnapshot, ProgramDelta)):
        return msg
    raise AssertionError(f"unexpected message {type(msg).__name__}")
