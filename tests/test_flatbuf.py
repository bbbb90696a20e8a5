"""The one flat-buffer helper: views laid end to end, packing and unpacking with casts."""

from __future__ import annotations

import pytest
import torch

from commbench.flatbuf import FlatBuffer, flat_views


def _tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(s, generator=gen) for s in [(3, 4), (5,), (2, 2, 2)]]


def test_views_lie_end_to_end_in_the_given_order():
    ts = _tensors()
    fb = FlatBuffer(ts)
    assert fb.flat.shape == (12 + 5 + 8,) and fb.nbytes == 25 * 4
    assert [tuple(v.shape) for v in fb.views] == [(3, 4), (5,), (2, 2, 2)]
    assert [v.data_ptr() - fb.flat.data_ptr() for v in fb.views] == [0, 12 * 4, 17 * 4]


def test_pack_then_unpack_gives_the_tensors_back():
    ts = _tensors()
    fb = FlatBuffer(ts)
    fb.pack(ts)
    assert torch.equal(fb.flat, torch.cat([t.reshape(-1) for t in ts]))
    out = [torch.zeros_like(t) for t in ts]
    fb.unpack(out)
    assert all(torch.equal(a, b) for a, b in zip(out, ts))


def test_another_dtype_casts_as_it_packs_and_unpacks():
    ts = _tensors()
    fb = FlatBuffer(ts, dtype=torch.float16)
    fb.pack(ts)
    assert fb.flat.dtype == torch.float16
    out = [torch.zeros_like(t) for t in ts]
    fb.unpack(out)
    assert all(o.dtype == torch.float32 for o in out)
    assert all(torch.equal(o, t.half().float()) for o, t in zip(out, ts))


def test_an_existing_buffer_of_the_wrong_size_is_refused():
    ts = _tensors()
    assert len(flat_views(torch.empty(25), ts)) == 3
    with pytest.raises(ValueError, match="25 elements"):
        FlatBuffer(ts, flat=torch.empty(24))
    with pytest.raises(ValueError, match="at least one tensor"):
        FlatBuffer([])
