import math

import numpy as np
import pytest

from commbench import metrics


def test_busbw_factor_allreduce_matches_nccl_tests():
    assert metrics.busbw_factor("allreduce", 1) == 0.0
    assert metrics.busbw_factor("allreduce", 2) == 1.0
    assert metrics.busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert metrics.busbw_factor("allgather", 4) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        metrics.busbw_factor("allreduce", 0)
    with pytest.raises(ValueError):
        metrics.busbw_factor("alltoall_weird", 4)


def test_algbw_and_busbw_in_gb_per_s():
    assert metrics.algbw(2e9, 1.0) == pytest.approx(2.0)
    # 1 GB in 0.5 s on 4 ranks: algbw 2 GB/s, busbw 2 * 2*3/4 = 3 GB/s
    assert metrics.busbw(1e9, 0.5, 4) == pytest.approx(3.0)
    assert math.isnan(metrics.algbw(1, 0.0))


def test_exposed_sync_share_and_overlap():
    assert metrics.exposed_sync(0.3, 0.2) == pytest.approx(0.1)
    assert metrics.exposed_sync(0.2, 0.25) == 0.0  # clock noise never gives negative sync
    assert metrics.sync_share(0.1, 0.4) == pytest.approx(0.25)
    assert math.isnan(metrics.sync_share(0.1, 0.0))
    assert metrics.overlap(0.02, 0.08) == pytest.approx(0.75)
    assert metrics.overlap(0.08, 0.08) == 0.0
    assert math.isnan(metrics.overlap(0.0, 0.0))


def test_scaling_efficiency():
    assert metrics.scaling_efficiency(700.0, 8, 100.0) == pytest.approx(0.875)
    assert math.isnan(metrics.scaling_efficiency(1.0, 8, 0.0))


@pytest.mark.parametrize("intervals,length", [
    ([], 0.0),
    ([(0, 1)], 1.0),
    ([(0, 1), (2, 3)], 2.0),
    ([(0, 2), (1, 3)], 3.0),          # overlapping
    ([(1, 3), (0, 2), (2.5, 4)], 4.0),  # unsorted, chained
    ([(0, 4), (1, 2)], 4.0),          # nested
    ([(0, 1), (1, 2)], 2.0),          # touching
])
def test_union_length(intervals, length):
    assert metrics.union_length(intervals) == pytest.approx(length)


@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_percentile_matches_numpy(q):
    rng = np.random.default_rng(0)
    xs = list(rng.random(37))
    assert metrics.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_summarize():
    s = metrics.summarize([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "p5": pytest.approx(1.1), "p95": pytest.approx(2.9),
                 "min": 1.0, "max": 3.0, "count": 3}
    assert math.isnan(metrics.summarize([])["median"])
