"""One place builds what an engine replica runs on, from ServerArgs: the tensor-parallel group,
the model runner, the tokenizer and its EOS ids, the scheduler and the program executor that
runs request graphs inside it. The in-process Engine and the scheduler process are thin shells
over a `Runtime`. (The grammar backend is built by the scheduler on the first constrained
request, so engines that never constrain never start its compile workers.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from radixflow.model_files import eos_token_ids, load_tokenizer
from radixflow.runtime.distributed.tp_launch import TPGroup, start_tp
from radixflow.runtime.execution.model_runner import ModelRunner
from radixflow.runtime.programs.program_executor import ProgramExecutor
from radixflow.runtime.scheduling.replica import attach_replica
from radixflow.runtime.scheduling.scheduler import Scheduler
from radixflow.runtime.server_args import ServerArgs


@dataclass
class Runtime:
    args: ServerArgs
    tp: Optional[TPGroup]  # tp_size > 1: this process is rank 0 of it (None otherwise)
    runner: ModelRunner
    tokenizer_path: str
    tokenizer: Any
    eos_ids: set
    scheduler: Scheduler
    programs: ProgramExecutor


def build_runtime(
    args: ServerArgs, emit_outputs: bool, on_tp_failure: Optional[Callable[[str], None]] = None
) -> Runtime:
    """`emit_outputs`: whether each scheduler step returns ReqOutputs (a process that sends them on)
    or nothing (the in-process Engine reads its requests directly). `on_tp_failure`: called with the
    reason when a tensor-parallel rank dies."""
    tp = start_tp(args, on_failure=on_tp_failure)  # tp_size > 1: spawns ranks 1..
    try:
        runner = ModelRunner(args)
    except BaseException:
        if tp is not None:
            tp.kill()
        raise
    tokenizer_path = args.tokenizer_path or runner.model_dir
    tokenizer = load_tokenizer(tokenizer_path, args.chat_template)
    eos_ids = eos_token_ids(tokenizer_path, runner.config, tokenizer)
    programs: ProgramExecutor  # the scheduler calls it back when a request graph's request finishes
    scheduler = Scheduler(args, runner, tokenizer, eos_ids, emit_outputs=emit_outputs,
                          continue_request=lambda req: programs.continue_request(req))
    programs = ProgramExecutor(scheduler, tokenizer)
    if tp is not None and args.tp_scheduler == "replicated":
        attach_replica(scheduler, programs.continue_request)
    return Runtime(args, tp, runner, tokenizer_path, tokenizer, eos_ids, scheduler, programs)
