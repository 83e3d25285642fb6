"""SRHT: subsampled randomised Hadamard transform.

``S = sqrt(m'/k) R H D P`` per chunk, where

* the block (m entries) is cut into the largest power of two 2^a <= m and the rest, and ``P``
  zero-pads each chunk to a power of two m' (so only the smaller chunk is padded: a 2,359,296-entry
  conv layer = 2^21 + 2^18 needs no padding at all, against 4,194,304 with one padded chunk);
  k is split across the chunks in proportion to their sizes (``pow2_chunks``);
* ``D = diag(d)``, ``d_i = +-1`` uniform (drawn for the m real entries; the padding is zero);
* ``H`` the normalised Walsh-Hadamard transform (Sylvester order, ``H = H^T = H^-1``), computed
  by ``fwht`` in torch in O(m' log m');
* ``R`` keeps k of the m' coordinates, uniform without replacement.

Per chunk ``E[R^T R] = (k/m') I`` so ``E[S^T S] = (m'/k) P^T D H (k/m') H D P = P^T P = I``, and the
block-diagonal S over the chunks is unbiased too. Draw order: signs (randint, the whole block),
then each chunk's rows (randperm), largest chunk first.
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch, random_signs


def next_pow2(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


#: bits of the Walsh-Hadamard transform done per pass (a 16 x 16 Hadamard matrix product):
#: fewer passes over memory than one butterfly stage per bit (3.9x faster at m = 2^22, one thread)
_RADIX_BITS = 4
_HADAMARD: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}


def _hadamard(r: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The unnormalised r x r Sylvester Hadamard matrix (+-1 entries), cached."""
    key = (r, dtype, str(device))
    if key not in _HADAMARD:
        h = torch.ones(1, 1, dtype=dtype, device=device)
        while h.shape[0] < r:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _HADAMARD[key] = h
    return _HADAMARD[key]


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalised fast Walsh-Hadamard transform along the last dimension (a power of two).

    Orthonormal and symmetric (so its own inverse); equals ``scipy.linalg.hadamard(m) / sqrt(m)``.
    H_m = H_r (x) ... (x) H_r (Sylvester order): view x as a tensor with log_r(m) axes of size
    r = 2^4 and multiply by H_r along each axis in turn (one matrix product per axis: O(m r log_r m)
    flops, O(m) memory per pass)."""
    m = x.shape[-1]
    if m < 1 or m & (m - 1):
        raise ValueError(f"fwht needs a power-of-two length, got {m}")
    lead = x.shape[:-1]
    y = x.reshape(-1, m)
    rows, bits, done = y.shape[0], m.bit_length() - 1, 0
    while done < bits:
        step = min(_RADIX_BITS, bits - done)
        r = 1 << step
        h = _hadamard(r, y.dtype, y.device)
        after, before = 1 << done, rows * (m >> (done + step))
        # axis of size r between `before` (more significant bits) and `after` (bits done already)
        y = y.reshape(before, r) @ h if after == 1 else torch.matmul(h, y.reshape(before, r, after))
        done += step
    return y.reshape(*lead, m) * (1.0 / math.sqrt(m))


def pow2_chunks(m: int, k: int) -> list[tuple[int, int, int, int]]:
    """(offset, size, padded size, rows) per chunk of a block of m entries with k rows: the
    largest power of two 2^a <= m is one chunk and the rest (< 2^a) another, padded to a power
    of two, so the transform pads at most the smaller part; k is split in proportion to the
    sizes (each chunk gets at least one row). m a power of two, or k = 1: one padded chunk."""
    big = 1 << (m.bit_length() - 1)
    if big == m or k < 2:
        return [(0, m, next_pow2(m), k)]
    rest = m - big
    k_big = min(max(round(k * big / m), 1), k - 1)
    return [(0, big, big, k_big), (big, rest, next_pow2(rest), k - k_big)]


class SRHTOperator(BlockOperator):
    def __init__(self, m: int, k: int, seed63: int) -> None:
        super().__init__(m, k, seed63)
        self.chunks = pow2_chunks(m, k)
        self.m_pad = sum(c[2] for c in self.chunks)

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        out = {"signs": random_signs(self.m, gen)}
        for i, (_, _, padded, rows) in enumerate(self.chunks):
            out[f"rows{i}"] = torch.randperm(padded, generator=gen)[:rows]
        return out

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structures(x.device, x.dtype)
        signed = x * s["signs"]
        parts = []
        for i, (off, size, padded, rows) in enumerate(self.chunks):
            z = x.new_zeros(padded)
            z[:size] = signed[off: off + size]
            parts.append(fwht(z)[s[f"rows{i}"]] * math.sqrt(padded / rows))
        return torch.cat(parts)

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        s = self.structures(y.device, y.dtype)
        parts, start = [], 0
        for i, (_, size, padded, rows) in enumerate(self.chunks):
            z = y.new_zeros(padded)
            z[s[f"rows{i}"]] = y[start: start + rows] * math.sqrt(padded / rows)
            parts.append(fwht(z)[:size])
            start += rows
        return torch.cat(parts) * s["signs"]


class SRHTSketch(LinearSketch):
    """``S = sqrt(m'/k) R H D`` per block (see the module docstring)."""

    kind = "srht"

    def _make_operator(self, shape, m, k, seed63):
        return SRHTOperator(m, k, seed63)
