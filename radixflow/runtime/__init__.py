"""Serving runtime. Sub-packages, top down: `server` (HTTP, the OpenAI layer and the
process pipeline), `programs` (request graphs run inside the scheduler), `scheduling`
(the scheduler loop, requests, KV ownership, sampling), `execution` (the model, its
layers and attention backends, forward passes, CUDA graphs) and `distributed`
(tensor-parallel groups, ranks and their launch). Modules here are the shared
vocabulary (`server_args`, `sampling_params`, `tokenizer`, ...) and the in-process
`Engine`."""
