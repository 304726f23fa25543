"""The scheduling core: requests, admission, the scheduler loop, KV ownership, stop checks, sampling and logprobs."""
