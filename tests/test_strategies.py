"""The strategies' common interface: typed settings (each strategy its own class, registered
beside it), ownership (close), buffer rules."""

from __future__ import annotations

import pytest
import torch

from commbench.strategies import (
    SETTINGS,
    STRATEGIES,
    AsyncSettings,
    BucketedSettings,
    CommonSettings,
    DDPSettings,
    FlatSettings,
    FSDPSettings,
    HorovodSettings,
    HsdpSettings,
    Sync,
    Zero1Settings,
    Zero2Settings,
    Zero3Settings,
    make_strategy,
    settings_for,
)
from commbench.strategies.flat import FlatStrategy


class _Comm:
    size = 1
    rank = 0
    supports_p2p = True
    runs_horovod = False
    device_collectives = False

    def allreduce_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype


def test_the_registry_holds_each_strategys_settings_class_beside_it():
    assert SETTINGS == {"flat": FlatSettings, "bucketed": BucketedSettings,
                        "hierarchical": FlatSettings, "horovod": HorovodSettings,
                        "ddp": DDPSettings, "async": AsyncSettings, "zero1": Zero1Settings,
                        "zero2": Zero2Settings, "zero3": Zero3Settings,
                        "hsdp": HsdpSettings, "fsdp": FSDPSettings}
    for name, cls in STRATEGIES.items():
        assert cls.settings_class is SETTINGS[name] and issubclass(SETTINGS[name], CommonSettings)
    # what is common to all, and what each adds
    assert FlatSettings.flag_fields() == ("compression", "accum_steps")
    assert set(BucketedSettings.flag_fields()) == {
        "compression", "accum_steps", "transfer", "bucket_mb", "first_bucket_mb", "progress"}
    assert set(AsyncSettings.flag_fields()) == {
        "compression", "accum_steps", "transfer", "staleness", "staleness_lr",
        "staleness_warmup"}
    assert set(DDPSettings.flag_fields()) == {"compression", "accum_steps", "bucket_mb"}
    assert set(Zero1Settings.flag_fields()) == set(Zero2Settings.flag_fields()) == {
        "compression", "accum_steps", "bucket_mb", "first_bucket_mb"}
    assert set(Zero3Settings.flag_fields()) == {
        "compression", "accum_steps", "prefetch", "reduce_scatter_group", "reshard_root"}
    assert settings_for("bucketed", bucket_mb=5) == BucketedSettings(bucket_mb=5)
    with pytest.raises(ValueError, match="unknown strategy 'flatt'"):
        settings_for("flatt")


def test_each_strategy_reads_its_own_settings_class():
    s = make_strategy("bucketed", _Comm(), [torch.zeros(4)],
                      BucketedSettings(bucket_mb=3, compression="fp16"), progress="poll")
    assert s.settings == BucketedSettings(bucket_mb=3, compression="fp16", progress="poll")
    assert s.knobs()["bucket_mb"] == 3.0 and s.knobs()["cast_dtype"] == "float16"
    flat = make_strategy("flat", _Comm(), [torch.zeros(4)], FlatSettings(compression="fp16"))
    assert flat.knobs()["algo"] == "native" and flat.knobs()["cast_dtype"] == "float16"
    with pytest.raises(TypeError, match="flat is built from FlatSettings, not BucketedSettings"):
        make_strategy("flat", _Comm(), [torch.zeros(4)], s.settings)
    assert isinstance(make_strategy("async", _Comm(), [torch.zeros(4)]).settings, AsyncSettings)


def test_a_setting_that_is_no_field_is_refused():
    with pytest.raises(TypeError, match="bucket_size"):
        make_strategy("flat", _Comm(), [torch.zeros(4)], bucket_size=1)
    with pytest.raises(TypeError, match="bucket_mb"):  # bucketed's and DDP's, not flat's
        make_strategy("flat", _Comm(), [torch.zeros(4)], bucket_mb=1)
    with pytest.raises(ValueError, match="unknown strategy 'flatt'"):
        make_strategy("flatt", _Comm(), [torch.zeros(4)])


@pytest.mark.parametrize("cls,bad,match", [
    (FlatSettings, {"compression": "int8"}, "--compression must be one of"),
    (FlatSettings, {"accum_steps": 0}, "--accum-steps must be an integer >= 1"),
    (BucketedSettings, {"bucket_mb": -1.0}, "--bucket-mb"),
    (BucketedSettings, {"bucket_mb": "automatic"}, "--bucket-mb"),
    (BucketedSettings, {"first_bucket_mb": float("inf")}, "--first-bucket-mb"),
    (BucketedSettings, {"progress": "spin"}, "--progress must be one of poll, thread"),
    (BucketedSettings, {"transfer": "nbc"}, "--transfer must be one of"),
    (BucketedSettings, {"accum_steps": True}, "--accum-steps"),
    (AsyncSettings, {"staleness": -1}, "--staleness must be an integer >= 0"),
    (AsyncSettings, {"staleness": 1.5}, "--staleness must be an integer >= 0"),
    (AsyncSettings, {"staleness_warmup": -2}, "--staleness-warmup"),
    (AsyncSettings, {"transfer": "nbc"}, "--transfer"),
    (AsyncSettings, {"algo": "ring"}, "--algo ring"),
    (DDPSettings, {"bucket_mb": float("nan")}, "--bucket-mb"),
    (HorovodSettings, {"compression": "bf16"}, "--compression bf16: Horovod has no bfloat16"),
])
def test_each_settings_class_refuses_a_bad_value_naming_the_flag(cls, bad, match):
    with pytest.raises(ValueError, match=match):
        cls(**bad)


def test_each_settings_class_says_what_applies_of_it():
    """What the tool asks without naming strategies: the transfer path a strategy's engine
    runs, what a job of so many steps cannot run, and notes on reading its runs."""
    assert FlatSettings().engine_transfer is None and DDPSettings().engine_transfer is None
    assert BucketedSettings(transfer="ring").engine_transfer == "ring"
    assert BucketedSettings(transfer="ring", progress="poll").engine_transfer is None
    assert AsyncSettings(transfer="thread").engine_transfer == "thread"
    AsyncSettings(staleness=4).check_steps(4)
    with pytest.raises(ValueError, match="--staleness 5: larger than --steps 4"):
        AsyncSettings(staleness=5).check_steps(4)
    BucketedSettings().check_steps(1)
    assert AsyncSettings(staleness=2).notes(1) and not AsyncSettings(staleness=2).notes(2)
    assert FlatSettings().notes(0) == []


def test_a_jobs_settings_hold_each_flag_once_and_build_each_strategys():
    sync = Sync(BucketedSettings(bucket_mb=5, compression="fp16"), AsyncSettings(staleness=2),
                transfer="ring")
    assert sync == Sync(bucket_mb=5, compression="fp16", staleness=2, transfer="ring")
    assert sync.bucket_mb == 5 and sync.transfer == "ring"
    # a shared flag reaches every strategy that reads it
    assert sync.settings("async") == AsyncSettings(staleness=2, transfer="ring",
                                                   compression="fp16")
    assert sync.settings("ddp") == DDPSettings(bucket_mb=5, compression="fp16")
    assert sync.for_run("flat", "ring", "local") == FlatSettings(
        algo="ring", compression="fp16", broadcast_buffers=False)
    assert sync.to_argv() == ["--compression", "fp16", "--bucket-mb", "5", "--transfer", "ring",
                              "--staleness", "2"]
    with pytest.raises(ValueError, match="--compression: the settings give both"):
        Sync(FlatSettings(compression="fp16"), AsyncSettings(compression="bf16"))
    with pytest.raises(TypeError, match="'bucket_size' sets no strategy's flag"):
        Sync(bucket_size=5)
    with pytest.raises(AttributeError, match="bucket_size"):
        _ = sync.bucket_size
    # what one strategy refuses is refused when its settings are built, not before
    bf16 = Sync(compression="bf16")
    with pytest.raises(ValueError, match="Horovod has no bfloat16"):
        bf16.settings("horovod")
    assert bf16.settings("flat").compression == "bf16"


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
