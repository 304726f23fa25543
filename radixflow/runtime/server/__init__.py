"""The HTTP server, the OpenAI-compatible layer, and the processes behind them (tokenizer manager, scheduler process, detokenizer, data-parallel replicas)."""
