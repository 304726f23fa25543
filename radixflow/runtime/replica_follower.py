"""A tensor-parallel rank > 0 under replicated scheduling: it loads its shard of the model,
runs the same Scheduler as rank 0 over the inputs rank 0 publishes (scheduling/replica.py),
and reports nothing: rank 0 alone talks to clients."""

from __future__ import annotations

from radixflow.model_files import eos_token_ids, load_tokenizer
from radixflow.runtime.execution.model_runner import ModelRunner
from radixflow.runtime.gc_freeze import freeze_startup_objects
from radixflow.runtime.scheduling.replica import attach_replica
from radixflow.runtime.scheduling.scheduler import Scheduler
from radixflow.runtime.server_args import ServerArgs


def follow_leader(args: ServerArgs) -> str:
    """Run rank 0's steps until it says stop; returns why it stopped."""
    runner = ModelRunner(args)
    try:
        tokenizer_path = args.tokenizer_path or runner.model_dir
        tokenizer = load_tokenizer(tokenizer_path)
        sched = Scheduler(args, runner, tokenizer, eos_token_ids(tokenizer_path, runner.config, tokenizer),
                          emit_outputs=False)  # fmt: skip
        sync = attach_replica(sched, None)
        freeze_startup_objects(not args.disable_gc_freeze)  # a full collection on one rank would stall every rank's collective
        while True:
            events = sync.receive_step()
            if events is None:
                return "shutdown"
            sync.apply(sched, events)
            sched.step()
    finally:
        runner.release_cuda_graphs()
