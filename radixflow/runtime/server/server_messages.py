"""Messages between the server's processes (pickled over ZMQ ipc sockets).

tokenizer manager -> scheduler:   TokenizedBatch, AbortReq, ControlReq
scheduler -> detokenizer:         NewRequests, OutputBatch, ControlReply, StatsSnapshot
detokenizer -> tokenizer manager: DetokBatch, ControlReply, StatsSnapshot
"""

from __future__ import annotations

import os
import socket
import stat
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
    """Removes this user's `radixflow-<pid>-*` socket directories left by servers that are gone; returns how many.
    Only a real directory (not a link) holding nothing but the three sockets, whose pid is not running here and
    whose scheduler socket refuses connections (a server in another pid namespace sharing /tmp still accepts)."""
    root = root or tempfile.gettempdir()
    removed = 0
    for name in os.listdir(root):
        try:
            removed += _remove_if_stale(os.path.join(root, name), name.split("-"))
        except (OSError, ValueError, OverflowError):  # gone meanwhile, not ours, an odd name: leave it
            continue
    return removed


def _remove_if_stale(path: str, parts: list) -> bool:
    if len(parts) < 3 or parts[0] != "radixflow" or not (parts[1].isascii() and parts[1].isdigit()):
        return False
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or not (socks := set(os.listdir(path))) <= _SOCKETS:
        return False
    if _alive(int(parts[1])) or _accepts(os.path.join(path, "sched")):
        return False
    for sock in socks:
        os.unlink(os.path.join(path, sock))
    os.rmdir(path)
    return True


def _alive(pid: int) -> bool:
    """Whether process `pid` runs here (another user's too: signalling it is refused, not unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _accepts(path: str) -> bool:
    """Whether something listens on the unix socket at `path` (False: refused, or no socket)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
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
    kind: str  # "flush_cache" | "server_info" | "start_profile" | "stop_profile"
    req_id: int
    # start_profile: its step_profiler.ProfileRequest. Keyword-only, so that subclasses' fields (ProgramReq's)
    # keep their positions after req_id.
    args: Any = field(default=None, kw_only=True)


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
