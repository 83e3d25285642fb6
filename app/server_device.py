"""The server's device: where the ServerApp computes (Grad-BANT's and FLTrust's trust-set
gradients, the lifts S^T y of sketched replies). Results go back to numpy on the CPU, so only the
floating-point arithmetic changes with it; on "cpu" every number is what it was before the key
existed.

``server-device``: ``device`` (the default: the run's ``device``, as the silos use it), ``cpu``,
``cuda`` or ``auto`` (CUDA where torch sees one). "cuda" on a server without CUDA is refused with
one line, as a silo refuses it (clients/silo.py); a deployment whose silos have GPUs and whose
server has none sets ``server-device = "cpu"`` (or ``"auto"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.options import ConfigError

if TYPE_CHECKING:
    from app.runtime_options import RuntimeOptions


def server_device_name(s: RuntimeOptions) -> str:
    """``server-device`` with "device" replaced by the run's ``device`` (cpu | cuda | auto)."""
    return s.device if s.server_device == "device" else s.server_device


def server_device(s: RuntimeOptions) -> Any:
    """The ``torch.device`` the server computes on for the runtime options ``s``; ConfigError (one line) for
    "cuda" where torch sees no CUDA device."""
    import torch

    want = server_device_name(s)
    if want == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        key = "device" if s.server_device == "device" else "server-device"
        raise ConfigError(f'{key} = "cuda" but the server has no CUDA device that torch can use (the ServerApp computes '
                          'on server-device, default: the run\'s device); set server-device = "cpu", or "auto" '
                          '(CUDA where there is one)')
    return torch.device(want)
