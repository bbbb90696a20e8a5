"""The strategies' common interface: typed settings, ownership (close), buffer rules."""

from __future__ import annotations

import pytest
import torch

from commbench.strategies import STRATEGIES, StrategySettings, make_strategy
from commbench.strategies.flat import FlatStrategy


class _Comm:
    size = 1
    rank = 0
    supports_p2p = True
    runs_horovod = False
    device_collectives = False

    def allreduce_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype


def test_every_strategy_reads_the_same_settings_record():
    s = make_strategy("bucketed", _Comm(), [torch.zeros(4)],
                      StrategySettings(bucket_mb=3, compression="fp16"), progress="poll")
    assert s.settings == StrategySettings(bucket_mb=3, compression="fp16", progress="poll")
    assert s.knobs()["bucket_mb"] == 3.0 and s.knobs()["cast_dtype"] == "float16"
    flat = make_strategy("flat", _Comm(), [torch.zeros(4)], s.settings)
    assert flat.knobs()["algo"] == "native" and flat.knobs()["cast_dtype"] == "float16"


def test_a_setting_that_is_no_field_is_refused():
    with pytest.raises(TypeError, match="bucket_size"):
        make_strategy("flat", _Comm(), [torch.zeros(4)], bucket_size=1)
    with pytest.raises(ValueError, match="unknown strategy 'flatt'"):
        make_strategy("flatt", _Comm(), [torch.zeros(4)])


def test_a_peer_without_its_workload_is_refused():
    with pytest.raises(ValueError, match="--strategy ddp wraps the workload's model"):
        make_strategy("ddp", _Comm(), [torch.zeros(4)])


def test_a_with_block_closes_the_strategy_when_the_run_ends_normally():
    closed = []

    class Flat(FlatStrategy):
        def close(self) -> None:
            closed.append(self)

    with Flat(_Comm(), [torch.zeros(4)]) as s:
        assert not closed
    assert closed == [s]
    # after an error the job aborts: closing could wait for transfers no peer completes
    with pytest.raises(RuntimeError, match="boom"), Flat(_Comm(), [torch.zeros(4)]):
        raise RuntimeError("boom")
    assert closed == [s]


def test_each_strategy_says_which_buffer_rule_it_follows():
    rules = {name: (cls.buffer_rule("broadcast"), cls.buffer_rule("local"))
             for name, cls in STRATEGIES.items()}
    assert rules["flat"] == rules["bucketed"] == rules["async"] == ("broadcast", "local")
    assert rules["ddp"] == ("ddp-broadcast", "ddp-local")
    assert rules["horovod"] == ("horovod-initial-broadcast",) * 2
    assert [n for n, cls in STRATEGIES.items() if cls.own_buffer_rule] == ["horovod"]
    with pytest.raises(ValueError, match="--buffers must be one of"):
        STRATEGIES["flat"].buffer_rule("everything")



def test_ddp_close_waits_until_no_callback_is_held_elsewhere():
    """Gloo's thread drops a bucket's Python callback after the rank's wait returned;
    one it drops while the interpreter shuts down aborts the process, so ``close``
    waits for every callback ``_reduce`` handed out to be released."""
    import threading
    import time
    import weakref

    from commbench.strategies.peers import DDPStrategy

    s = DDPStrategy.__new__(DDPStrategy)  # only close's bookkeeping, no process group
    s._callbacks = weakref.WeakSet()
    held = [lambda f: f]
    s._callbacks.add(held[0])
    released = []

    def release() -> None:
        time.sleep(0.2)
        released.append(time.perf_counter())
        held.clear()  # the last strong reference, as Gloo's thread drops its own

    threading.Thread(target=release).start()
    s.close()
    assert released and time.perf_counter() >= released[0] and not len(s._callbacks)
