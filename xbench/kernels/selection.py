"""What a query attends: a dense run of pages (a page table) or sparse token indices.

- :class:`DensePages`: the first ``num_tokens`` tokens of ``pages`` in order, as a paged
  cache's block table describes a contiguous chunk.
- a ``torch.Tensor`` of flat token indices (``page * block_size + slot``): 1-D when every
  query row attends the same tokens, 2-D ``[rows, k]`` when each row has its own selection
  (a DSA indexer's top-k). Entries of ``-1`` are padding and are not attended.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DensePages:
    pages: torch.Tensor  # integer page ids, in order (int32 as a block table, or int64)
    num_tokens: int

    def token_indices(self, block_size: int) -> torch.Tensor:
        slots = torch.arange(block_size, device=self.pages.device)
        flat = (self.pages.to(torch.int64)[:, None] * block_size + slots).flatten()
        return flat[: self.num_tokens]

    def contiguous_start(self) -> int | None:
        """First page when the pages are consecutive (no gather needed), else None."""
        p = self.pages
        if len(p) == 0:
            return None
        first = int(p[0])
        if torch.equal(p.cpu(), torch.arange(first, first + len(p))):
            return first
        return None


def token_indices(indices, block_size: int) -> torch.Tensor:
    """Flat token indices of any selection (1-D or 2-D; -1 = padding)."""
    if isinstance(indices, DensePages):
        return indices.token_indices(block_size)
    if not isinstance(indices, torch.Tensor) or indices.dim() not in (1, 2):
        raise TypeError("indices must be DensePages or a 1-D / 2-D integer tensor of token indices")
    return indices.to(torch.int64)


def random_topk(num_tokens: int, k: int, rows: int, generator=None) -> torch.Tensor:
    """Per-row random selections of k distinct tokens out of num_tokens (an indexer's output)."""
    k = min(k, num_tokens)
    scores = torch.rand(rows, num_tokens, generator=generator)
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values
