"""One contiguous buffer holding a list of tensors, with a view of each: Horovod's
fusion buffer, DDP's bucket.

One collective on one flat buffer costs one latency instead of one per
tensor (ResNet-50 has 161 gradient tensors, 53 BatchNorm layers' buffers),
and MPI needs contiguous memory. ``FlatBuffer(like)`` lays the tensors of
``like`` end to end; ``views[i]`` is the part shaped as ``like[i]``, so
packing is a copy per tensor (or one ``torch.cat``) and unpacking is a read
of the views. The buffer may have another dtype than the tensors (a
compressed wire) or live elsewhere (host memory for an MPI that is not
CUDA-aware): ``pack`` and ``unpack`` then cast and move as they copy.

Example::

    fb = FlatBuffer(grads)           # same dtype and device as the gradients
    fb.pack(grads)
    comm.allreduce(fb.flat)
    fb.unpack(grads)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def flat_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive parts of ``flat``, each shaped as the tensor of ``like`` at its place."""
    numel = sum(t.numel() for t in like)
    if flat.dim() != 1 or flat.numel() != numel:
        raise ValueError(f"a flat buffer for these tensors is 1-D with {numel} elements, "
                         f"got shape {tuple(flat.shape)}")
    views, offset = [], 0
    for t in like:
        views.append(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()
    return views


class FlatBuffer:
    """``flat``: one 1-D buffer; ``views``: its parts, shaped as ``like``'s tensors.

    Args:
        like: the tensors it holds, in buffer order (only their shapes and, by
            default, dtype and device are read).
        dtype: the buffer's dtype (default: the first tensor's).
        device: where it lives (default: the first tensor's device).
        flat: an existing buffer to view instead of a new one.
    """

    __slots__ = ("flat", "views")

    def __init__(self, like: Sequence[torch.Tensor], dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None,
                 flat: torch.Tensor | None = None) -> None:
        if not like:
            raise ValueError("a flat buffer needs at least one tensor")
        if flat is None:
            flat = torch.empty(sum(t.numel() for t in like), dtype=dtype or like[0].dtype,
                               device=device if device is not None else like[0].device)
        self.flat = flat
        self.views = flat_views(flat, like)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def pack(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copy ``tensors`` (``like``'s, in order) into the buffer.

        One ``torch.cat`` where every tensor already has the buffer's dtype and
        device, else a copy (cast, move) per tensor.
        """
        if all(t.dtype == self.flat.dtype and t.device == self.flat.device for t in tensors):
            torch.cat([t.detach().reshape(-1) for t in tensors], out=self.flat)
        else:
            for v, t in zip(self.views, tensors):
                v.copy_(t.detach())

    def unpack(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copy the buffer's parts back into ``tensors`` (cast, move as needed)."""
        with torch.no_grad():
            for t, v in zip(tensors, self.views):
                t.copy_(v)
