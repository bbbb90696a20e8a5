import pytest

from commbench.linkstats import link_efficiency, link_iface, read_iface_bytes

PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  123456     100    0    0    0     0          0         0   123456     100    0    0    0     0       0          0
  eth0: 9000000    7000    0    0    0     0          0         0  5000000    4000    0    0    0     0       0          0
"""


def test_read_iface_bytes(tmp_path):
    f = tmp_path / "dev"
    f.write_text(PROC_NET_DEV)
    assert read_iface_bytes("eth0", str(f)) == (9_000_000, 5_000_000)
    assert read_iface_bytes("lo", str(f)) == (123456, 123456)
    with pytest.raises(ValueError, match="COMMBENCH_LINK_IFACE=eth9"):
        read_iface_bytes("eth9", str(f))


def test_real_proc_net_dev_has_loopback():
    rx, tx = read_iface_bytes("lo")
    assert rx >= 0 and tx >= 0


def test_link_efficiency():
    # 1.75 GB through a 10 Gbit/s link ideally takes 1.4 s; measured 2.0 s -> 0.7
    assert link_efficiency(1_750_000_000, 10.0, 2.0) == pytest.approx(0.7)
    assert link_efficiency(None, 10.0, 2.0) is None
    assert link_efficiency(100, None, 2.0) is None
    assert link_iface({}) is None and link_iface({"COMMBENCH_LINK_IFACE": "eth0"}) == "eth0"
