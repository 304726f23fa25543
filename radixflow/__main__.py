"""Command line: `radixflow serve` (the HTTP server) and `radixflow demo` (a short generation through Engine)."""

from __future__ import annotations

import argparse
import sys
import time


def demo(argv: list[str]) -> int:
    from radixflow.runtime.engine import Engine
    from radixflow.runtime.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="radixflow demo")
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli(parser.parse_args(argv))
    t0 = time.time()
    engine = Engine(**{k: v for k, v in vars(args).items() if k != "extra"})
    print(f"loaded {engine.runner.model_dir} in {time.time() - t0:.1f}s", flush=True)
    prompts = ["The capital of France is", "List three colors:", "The capital of France is a city where"]
    t0 = time.time()
    outs = engine.generate(prompts, {"max_new_tokens": 32, "temperature": 0})
    for p, o in zip(prompts, outs):
        m = o["meta_info"]
        print(f"--- {p!r} ({m['prompt_tokens']} prompt tokens, {m['cached_tokens']} cached)\n{o['text']}")
    print(f"{sum(o['meta_info']['completion_tokens'] for o in outs)} tokens in {time.time() - t0:.2f}s")
    return 0


def serve_args(argv: list[str]):
    """`radixflow serve`'s arguments as ServerArgs; argparse's exit (status 2, the reason on stderr) for bad ones."""
    from radixflow.errors import RadixflowError
    from radixflow.runtime.server_args import ServerArgs
    from radixflow.runtime.sglang_flags import add_sglang_flags, flag_conflict

    parser = argparse.ArgumentParser(prog="radixflow serve", description="Start the HTTP server (native + OpenAI API).")
    ServerArgs.add_cli_args(parser)
    add_sglang_flags(parser)
    namespace = parser.parse_args(argv)
    if conflict := flag_conflict(namespace):
        parser.error(conflict)
    try:
        args = ServerArgs.from_cli(namespace)
        if args.chat_template is not None:  # read and compiled now, not after the model has loaded
            from radixflow.model_files import read_chat_template

            read_chat_template(args.chat_template)
    except RadixflowError as e:
        parser.error(str(e))
    return args


def serve(argv: list[str]) -> int:
    args = serve_args(argv)
    from radixflow.runtime.server.launch_server import launch_server  # torch: not for --help or a bad flag

    return launch_server(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: radixflow serve|demo [--model-path PATH] [--host HOST] [--port PORT] [server args...]")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        return demo(rest)
    if cmd == "serve":
        return serve(rest)
    print(f"unknown command {cmd!r}; try: radixflow serve or radixflow demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
