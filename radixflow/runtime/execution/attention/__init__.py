"""Attention backends over the paged KV pool."""

from radixflow.runtime.execution.attention.base import AttentionBackend, create_attention_backend

__all__ = ["AttentionBackend", "create_attention_backend"]
