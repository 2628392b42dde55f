"""How far a bf16 attention result may lie from float64 attention over the same inputs.

A bf16 kernel (FlashMLA, this project's C, Triton and torch paths) rounds each probability to
bf16 before the second product and divides by a sum of them: with u = 2^-8, bf16's unit
roundoff, an output element ``o = sum_t p_t v_t`` then differs from the exact one by the
rounding of the probabilities, ``|sum_t p_t v_t d_t|`` with each ``|d_t| <= u``, plus at
most ``u |o|`` for the sum it is divided by (fp32 products and sums add orders less). The
first term is at most ``u sum_t p_t |v_t|`` (``P @ |V|``); as the roundings of different
probabilities are independent and centred, it also stays below ``lam u sqrt(sum_t p_t^2
v_t^2)`` except with probability ``2 exp(-lam^2 / 2)`` (Hoeffding; Higham and Mary's
probabilistic rounding-error analysis), ``2.5e-14`` per element at ``lam = 8``: far tighter
over many tokens, where the roundings cancel. A partial computed at another instance and
merged adds its own sum's rounding and, shipped in bf16 as a route's answer is, one more
rounding of it: each at most ``u`` of its share of ``P @ |V|``.

The bound replaced ``8e-4 + 1.6e-2 |o|``, which counted only the element's own size: an
element near zero over few tokens (its terms cancelling) lies past 8e-4 by chance, and
among the 4 M elements of 64 rows x 128 heads one did in every run tried (``xbench validate
--rows 64 --heads 128 --chunk 64`` called a result right to its rounding wrong, on the C
kernel and on the torch path).
"""

from __future__ import annotations

BF16_U = 2.0**-8  # bf16 keeps 8 significant bits: round to nearest is within 2^-8
LAMBDA = 8.0  # the probabilistic bound's width: exceeded with probability 2.5e-14
BLOCK_ELEMENTS = 2**24  # float64 scores a block: 128 MiB


def reference_attention(q, tokens, scale: float, v_dim: int):
    """float64 attention of ``q`` [rows, heads, D] over ``tokens`` [T, D] (MLA: V is the
    first ``v_dim`` columns) -> (out, lse, P @ |V|, sqrt(P^2 @ V^2)), the last two the scales
    of :func:`bf16_tolerance`. Rows go in blocks, so a large case costs no more memory
    than one block's scores."""
    import torch

    rows, heads, dim = q.shape
    flat = q.reshape(-1, dim).double()
    keys = tokens.double()
    values = keys[:, :v_dim]
    blocks = []
    step = max(1, BLOCK_ELEMENTS // max(1, keys.shape[0]))
    for start in range(0, flat.shape[0], step):
        scores = (flat[start : start + step] @ keys.T) * scale
        lse = torch.logsumexp(scores, dim=1)
        p = torch.exp(scores - lse[:, None])
        blocks.append((p @ values, lse, p @ values.abs(), ((p * p) @ (values * values)).sqrt()))
    out, lse, magnitude, spread = (torch.cat(column) for column in zip(*blocks, strict=True))
    return (
        out.reshape(rows, heads, v_dim),
        lse.reshape(rows, heads),
        magnitude.reshape(rows, heads, v_dim),
        spread.reshape(rows, heads, v_dim),
    )


def bf16_tolerance(out, magnitude, spread, *, remote: bool = False):
    """The largest |error| per element of a bf16 attention result against float64
    (``out``, ``magnitude`` and ``spread`` from :func:`reference_attention`); ``remote``:
    part of it was attended elsewhere, merged, and crossed the wire in bf16 (a route)."""
    import torch

    # merged parts: each part's roundings within lam u of its own share's spread, so the
    # two together within sqrt(2) of the whole's
    rounding = torch.minimum(magnitude, LAMBDA * spread * (2**0.5 if remote else 1.0))
    # the divisions by the sums: u |out| for one; for merged parts u of each part's
    # magnitude, and as much again for the bf16 answer, both within u P @ |V|
    division = 2 * magnitude if remote else out.abs()
    return BF16_U * (rounding + division)
