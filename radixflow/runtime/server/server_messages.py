"""Messages between the server's processes (pickled over ZMQ ipc sockets).

tokenizer manager -> scheduler:   TokenizedBatch, AbortReq, ControlReq
scheduler -> detokenizer:         NewRequests, OutputBatch, ControlReply, StatsSnapshot
detokenizer -> tokenizer manager: DetokBatch, ControlReply, StatsSnapshot
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Optional

from radixflow.runtime.scheduling.req import Req, ReqOutput


@dataclass
class IpcNames:
    """ZMQ endpoints of one server instance."""

    scheduler: str
    detokenizer: str
    tokenizer: str

    @classmethod
    def fresh(cls) -> "IpcNames":
        """Sockets in a new directory only this user can enter: the messages are pickles,
        so no other local user may connect. The directories of servers killed before they could remove theirs
        (SIGKILL) are removed first (a soak test found hundreds left in /tmp)."""
        remove_stale_ipc_dirs()
        base = tempfile.mkdtemp(prefix=f"radixflow-{os.getpid()}-")  # mode 0700
        return cls(f"ipc://{base}/sched", f"ipc://{base}/detok", f"ipc://{base}/tok")

    @property
    def directory(self) -> str:
        return os.path.dirname(self.scheduler[len("ipc://") :])


_SOCKETS = {"sched", "detok", "tok"}


def remove_stale_ipc_dirs(root: Optional[str] = None) -> int:
    """Removes this user's `radixflow-<pid>-*` socket directories whose process is gone; returns how many. Only
    directories that hold nothing but the three sockets are touched."""
    root = root or tempfile.gettempdir()
    removed = 0
    for name in os.listdir(root):
        parts = name.split("-")
        path = os.path.join(root, name)
        if len(parts) < 3 or parts[0] != "radixflow" or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        try:
            if os.stat(path).st_uid != os.getuid() or not set(os.listdir(path)) <= _SOCKETS:
                continue
            for sock in os.listdir(path):
                os.unlink(os.path.join(path, sock))
            os.rmdir(path)
            removed += 1
        except OSError:  # gone meanwhile, or not a directory
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


@dataclass
class ModelInfo:
    """What the scheduler process tells the main process once the model is loaded."""

    model_path: Optional[str]
    model_dir: Optional[str]
    tokenizer_path: str
    architectures: list
    vocab_size: int
    context_len: int
    max_total_num_tokens: int
    eos_ids: set


@dataclass
class TokenizedBatch:
    reqs: list[Req]
    stream: bool = False


@dataclass
class AbortReq:
    rid: Optional[str] = None
    abort_all: bool = False


@dataclass
class ControlReq:
    kind: str  # "flush_cache" | "server_info"
    req_id: int


@dataclass
class ControlReply:
    req_id: int
    result: Any


@dataclass
class ProgramDelta:
    """Text of a streamed program's main strand (`POST /program` with "stream": true)."""

    req_id: int
    var: Optional[str]
    text: str
    meta: Optional[dict] = None  # the chunk's logprobs, where the gen asks for them


@dataclass
class DecodeParams:
    skip_special_tokens: bool = True
    cut_strs: list = field(default_factory=list)  # SamplingParams.cut_strs: a stream holds back their beginnings
    no_stop_trim: bool = False


@dataclass
class NewRequests:
    params: dict[str, DecodeParams]  # rid -> how to turn its tokens into text


@dataclass
class StatsSnapshot:
    num_running: int = 0
    num_waiting: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    gen_throughput: float = 0.0
    max_total_num_tokens: int = 0
    free_slots: int = 0
    cached_slots: int = 0
    grammar_rows_switched: int = 0


@dataclass
class OutputBatch:
    outputs: list[ReqOutput]
    stats: Optional[StatsSnapshot] = None


@dataclass
class DetokBatch:
    outputs: list[ReqOutput]
    texts: list[str]  # cumulative text of each output, stop strings trimmed
    stats: Optional[StatsSnapshot] = None
