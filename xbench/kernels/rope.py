"""Rotary position embedding on the trailing RoPE part of MLA latents.

DeepSeek-V3's reference code rotates interleaved pairs (x[2i], x[2i+1]) by angle
``position * inv_freq[i]`` with ``inv_freq[i] = theta ** (-2i / rope_dim)``. Rotations
compose, R(p + d) = R(d) R(p), so moving a cached token from position p to p + d is one
more rotation by d: that is the splice's re-rotation. Models with YaRN scaling pass their
own ``inv_freq``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=16)
def inv_freq(
    rope_dim: int = 64, theta: float = 10000.0, dtype=torch.float64, device=None
) -> torch.Tensor:
    """The frequencies, computed once per shape and device (callers must not write to the
    result). Made on the device that uses them: a copy from the host inside a CUDA graph's
    capture is refused (it failed ``xbench kernel``'s splice on an H100)."""
    return theta ** (-torch.arange(0, rope_dim, 2, dtype=dtype, device=device) / rope_dim)


def shift_on(shift, device) -> torch.Tensor:
    """A position shift as an int64 tensor on ``device``: an integer is filled there, not
    copied from the host, since a CUDA graph's capture refuses host-to-device copies (the
    splice's did on an H100)."""
    if isinstance(shift, int | np.integer):
        return torch.full((), int(shift), dtype=torch.int64, device=device)
    return torch.as_tensor(shift, dtype=torch.int64, device=device)


def rotate(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x[..., rope_dim]`` by ``positions[...] * freqs``.

    Computed in float64 (or float32 on devices without it) and returned in x's dtype,
    so the only error is one rounding to the cache dtype.
    """
    work = torch.float64 if x.device.type == "cpu" else torch.float32
    angles = positions.to(work)[..., None] * freqs.to(device=x.device, dtype=work)
    # A pair (even, odd) is the complex number even + i odd; the rotation multiplies it by
    # e^(i angle). (Stacking the two real products back into pairs cost 2/3 of the time.)
    turn = torch.polar(torch.ones_like(angles), angles)
    pairs = torch.view_as_complex(x.to(work).contiguous().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)
