"""Serving runtime: engine, scheduler, model runner, sampler (and the HTTP server)."""
