"""Kernels: Triton implementations for CUDA, each with a torch reference used on CPU."""
