"""Tensor parallelism: process groups, the per-pass protocol between ranks, and launching the ranks."""
