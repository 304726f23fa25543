"""KV memory: the per-layer K/V token pool, its page allocator, and the req->token table.

A slot holds one token's K and V for every layer. Slots are grouped into pages of
`page_size`; the allocator hands out whole pages. Page 0 is never handed out: its
slots are a scratch target for padded rows (e.g. CUDA-graph padding).
"""

from __future__ import annotations

import numpy as np
import torch

from radixflow.host_copy import to_device_async


class PageAllocator:
    """Free list of KV pages. Pages are the unit of ownership."""

    def __init__(self, num_pages: int, page_size: int, device: str = "cpu"):
        assert num_pages >= 2, "need at least one usable page besides the scratch page"
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = device
        self.clear()

    def clear(self) -> None:
        self._free = torch.arange(1, self.num_pages, dtype=torch.int64)
        self._returned: list[torch.Tensor] = []  # freed since the last gather, in order
        self._num_returned = 0

    @property
    def free_pages(self) -> torch.Tensor:
        """The free page ids (int64, on the host; do not modify)."""
        self._gather()
        return self._free

    @property
    def num_free_pages(self) -> int:
        return int(self._free.numel()) + self._num_returned

    @property
    def num_free_slots(self) -> int:
        return self.num_free_pages * self.page_size

    @property
    def capacity_slots(self) -> int:
        return (self.num_pages - 1) * self.page_size

    def alloc(self, n_pages: int) -> torch.Tensor | None:
        """Return `n_pages` page ids, or None if not enough are free. Pages come in the order
        they were freed (the initial ones first)."""
        if n_pages > self._free.numel():
            if n_pages > self.num_free_pages:
                return None
            self._gather()
        pages, self._free = self._free[:n_pages], self._free[n_pages:]
        return pages

    def free(self, pages: torch.Tensor) -> None:
        """Queue pages behind the free list. Appending them to it at once would copy the whole
        list, as large as the KV pool, for every request that frees a few."""
        if pages.numel():
            self._returned.append(pages.to(torch.int64).cpu())
            self._num_returned += int(pages.numel())

    def _gather(self) -> None:
        if self._returned:
            self._free = torch.cat([self._free, *self._returned])
            self._returned, self._num_returned = [], 0

    def slots_of(self, pages: torch.Tensor) -> torch.Tensor:
        offs = torch.arange(self.page_size, dtype=torch.int64)
        return (pages.view(-1, 1) * self.page_size + offs).view(-1)

    def free_slots(self, slots: torch.Tensor) -> None:
        """Free the pages that `slots` start or cover. Slots must cover whole pages,
        except a request's tail page, which it owns alone and which is freed whole."""
        if slots.numel() == 0:
            return
        if self.page_size == 1:  # every slot is its own page, and a request's slots are distinct
            self.free(slots)
            return
        pages = torch.unique(slots.cpu() // self.page_size)
        self.free(pages)


class KVPool:
    """K and V buffers `[num_slots, kv_heads, head_dim]` per layer, plus the allocator.

    An FP8 pool (dtype float8_e4m3fn) stores K / k_scale and V / v_scale per layer and KV head
    (`k_scale[layer]`: float32 [kv_heads], 1.0 unless the checkpoint calibrated them): readers
    multiply back. Other pools keep the scales at 1.0 and never read them."""

    def __init__(
        self,
        num_slots: int,
        page_size: int,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str,
    ):
        num_pages = num_slots // page_size + 1  # +1: the scratch page
        self.allocator = PageAllocator(num_pages, page_size, device)
        total = num_pages * page_size
        self.k = [torch.zeros(total, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(total, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.k_scale = [torch.ones(kv_heads, dtype=torch.float32, device=device) for _ in range(num_layers)]
        self.v_scale = [torch.ones(kv_heads, dtype=torch.float32, device=device) for _ in range(num_layers)]
        self.fp8 = dtype == torch.float8_e4m3fn
        self.page_size = page_size
        self.dtype = dtype
        self.device = device

    def release(self) -> None:
        """Drops the buffers now (at shutdown), whoever still holds the pool: the readers index
        these lists at each call and keep no buffer of their own."""
        for bufs in (self.k, self.v, self.k_scale, self.v_scale):
            bufs.clear()

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.fp8:  # index_copy_ has no FP8 kernel: the bytes go in as uint8
            for buf, x, scale in ((self.k[layer], k, self.k_scale[layer]), (self.v[layer], v, self.v_scale[layer])):
                q = (x.float() / scale[:, None]).clamp(-448.0, 448.0).to(self.dtype)
                buf.view(torch.uint8).index_copy_(0, slots, q.view(torch.uint8))
            return
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))

    def set_scales(self, layer: int, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        """A checkpoint's calibrated scales for one layer: a scalar or one per KV head of this rank."""
        self.k_scale[layer].copy_(k_scale.float().reshape(-1).expand(self.k_scale[layer].numel()))
        self.v_scale[layer].copy_(v_scale.float().reshape(-1).expand(self.v_scale[layer].numel()))


class ReqToTokenPool:
    """`[max_running_requests, max_context]` int32 table; row r = KV slots of request r.

    The scheduler reads a host copy (`host`), so that it never waits for the GPU. `write` updates the
    host copy and notes the span; `flush`, before each forward pass, copies every span noted since in one
    asynchronous copy and one scatter (on CPU they are one tensor), where copying at every write took
    three small transfers and kernel launches per request in every extend pass (its cached prefix, its
    new slots, the tree's slots after the pass).
    """

    def __init__(self, size: int, max_context: int, device: str):
        self.table = torch.zeros(size, max_context, dtype=torch.int32, device=device)
        on_host = self.table.device.type == "cpu"
        self.host = self.table if on_host else torch.zeros(size, max_context, dtype=torch.int32)
        self._spans: list = []  # (row, start, length) written on the host since the last flush
        self.size = size
        self.clear()

    def release(self) -> None:
        """Drops the table and its host copy now (at shutdown), whoever still holds the pool: with a
        long context and many rows the table alone is hundreds of MB on the device."""
        self.table = self.host = torch.empty(0, 0, dtype=torch.int32)
        self._spans = []

    @property
    def host(self) -> torch.Tensor:
        return self._host

    @host.setter
    def host(self, table: torch.Tensor) -> None:
        # with an array over the same memory: the scheduler's per-request reads and writes slice it, and
        # a numpy slice costs well under a microsecond where a torch one costs several
        self._host, self._cells = table, table.numpy()

    def alloc(self) -> int | None:
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._is_free[row] = False
        return row

    def free(self, row: int) -> None:
        assert not self._is_free[row], "a row freed twice"  # a flag, not a scan of the free list per request
        self._is_free[row] = True
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        n = slots.numel()
        self._cells[row, start : start + n] = slots.cpu().numpy()
        if self.host is not self.table and n:
            self._spans.append((row, start, n))

    def flush(self) -> None:
        """The device table gets every span written since the last flush: each row's written range (its
        current host values, which equal the device's outside the spans) packed into one copy, and the
        cells' indices worked out on the device (a host loop over the tokens cost more than the copies)."""
        if not self._spans:
            return
        ranges: dict = {}  # row -> (lo, hi) covering its spans
        for row, start, n in self._spans:
            lo, hi = ranges.get(row, (start, start + n))
            ranges[row] = (min(lo, start), max(hi, start + n))
        self._spans = []
        width, dev = self.host.shape[1], self.table.device
        vals = self.packed(ranges)
        meta = torch.tensor([(row * width + lo, hi - lo) for row, (lo, hi) in ranges.items()], dtype=torch.int64)
        vals, meta = to_device_async(vals, dev), to_device_async(meta, dev)
        starts, lens = meta.unbind(1)
        before = torch.cumsum(lens, 0) - lens  # where each range starts in `vals`
        flat = torch.repeat_interleave(starts - before, lens, output_size=vals.numel())
        flat += torch.arange(vals.numel(), device=dev)
        self.table.view(-1).index_copy_(0, flat, vals)

    def packed(self, ranges: dict) -> torch.Tensor:
        """The host values of each row's range (`{row: (lo, hi)}`), one after another (int32)."""
        return torch.from_numpy(np.concatenate([self._cells[row, lo:hi] for row, (lo, hi) in ranges.items()]))

    def write_points(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        """table[rows[i], cols[i]] = slots[i] (host int64 tensors), in one scatter."""
        self.host[rows, cols] = slots.to(torch.int32)
        if self.host is not self.table:
            dev = self.table.device
            packed = to_device_async(torch.stack([rows, cols, slots]), dev)
            self.table[packed[0], packed[1]] = packed[2].to(torch.int32)

    def read(self, row: int, end: int, start: int = 0) -> torch.Tensor:
        """The row's slots `start:end`, int64, on the host (a copy of just those)."""
        return torch.from_numpy(self._cells[row, start:end].astype(np.int64))

    def read_spans(self, spans: list) -> torch.Tensor:
        """The slots of each (row, start, end) of `spans`, one after another, int64, on the host."""
        return torch.from_numpy(np.concatenate([self._cells[row, a:b] for row, a, b in spans]).astype(np.int64))

    def read_at(self, row: int, col: int) -> int:
        return int(self._cells[row, col])

    def clear(self) -> None:
        self._free_rows = list(range(self.size))
        self._is_free = [True] * self.size
