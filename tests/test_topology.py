from commbench.comm import detect_backend, launcher_rank, topology_from_hostnames


def test_even_nodes():
    hosts = ["a", "a", "b", "b"]
    t = [topology_from_hostnames(r, hosts) for r in range(4)]
    assert [(x.local_rank, x.local_size, x.cross_rank, x.cross_size) for x in t] == [
        (0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
    assert t[0].nodes == 2 and t[0].local_sizes == (2, 2)


def test_uneven_nodes_three_plus_one():
    hosts = ["a", "a", "a", "b"]
    t = [topology_from_hostnames(r, hosts) for r in range(4)]
    assert [(x.local_rank, x.local_size) for x in t] == [(0, 3), (1, 3), (2, 3), (0, 1)]
    # local rank 0 exists on both hosts; local ranks 1 and 2 only on host a
    assert [(x.cross_rank, x.cross_size) for x in t] == [(0, 2), (0, 1), (0, 1), (1, 2)]
    assert t[3].local_sizes == (3, 1)


def test_interleaved_hosts_keep_rank_order():
    hosts = ["b", "a", "b", "a"]
    t = [topology_from_hostnames(r, hosts) for r in range(4)]
    assert [x.local_rank for x in t] == [0, 0, 1, 1]
    assert [x.cross_rank for x in t] == [0, 1, 0, 1]  # hosts ordered by first rank


def test_detect_backend():
    assert detect_backend({}) == "mpi"
    assert detect_backend({"OMPI_COMM_WORLD_RANK": "0"}) == "mpi"
    assert detect_backend({"HOROVOD_RANK": "1", "HOROVOD_CONTROLLER": "gloo"}) == "horovod"
    # horovodrun --mpi: exports these two together through mpirun -x
    assert detect_backend({"OMPI_COMM_WORLD_RANK": "0", "NCCL_SOCKET_IFNAME": "lo",
                           "OMPI_MCA_btl_tcp_if_include": "lo"}) == "horovod"


def test_launcher_rank():
    assert launcher_rank({}) == 0
    assert launcher_rank({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert launcher_rank({"HOROVOD_RANK": "2"}) == 2
