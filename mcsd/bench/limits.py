"""The machine's own limits, measured right before each benchmark point: its peak matrix-multiply
rate (the MFU denominator where no published peak is known, :mod:`mcsd.bench.peaks`) and its
memory read bandwidth (the denominator of decoding's limit)."""

from __future__ import annotations

import torch

from mcsd.bench.measure import timed
from mcsd.precision import DTYPES


def matmul_peak_flops(device: str, dtype: str, size: int = 2048, repeats: int = 10) -> float:
    """This machine's peak matrix-multiply rate (FLOP/s), the MFU denominator: the fastest of
    ``repeats`` square products after a warm-up (the best case is the peak; slower runs
    are interference)."""
    device_, dtype_ = torch.device(device), DTYPES[dtype]
    a = torch.randn(size, size, device=device_).to(dtype_)
    b = torch.randn(size, size, device=device_).to(dtype_)
    for _ in range(2):
        torch.matmul(a, b)
    seconds = min(timed(lambda: torch.matmul(a, b), device_)[0] for _ in range(repeats))
    return 2 * size**3 / seconds


def read_bandwidth_bytes_per_s(device: str, megabytes: int = 256, repeats: int = 10) -> float:
    """This machine's memory read bandwidth (bytes/s), the denominator of decoding's limit: the
    fastest of ``repeats`` sums over a buffer far larger than the caches, after a warm-up."""
    device_ = torch.device(device)
    buffer = torch.ones(megabytes * 2**20 // 4, device=device_)
    for _ in range(2):
        buffer.sum()
    seconds = min(timed(buffer.sum, device_)[0] for _ in range(repeats))
    return buffer.numel() * buffer.element_size() / seconds
