"""The container cluster for real: image, compose, horovodrun and mpirun across containers.

Where this machine can run a Docker daemon (root, dockerd, docker compose or
docker-compose 1.29, debootstrap): start dockerd if none answers (and stop it
again at the end), make the debootstrap base image if it is missing (it stays in
the daemon: the cache between runs), build the image with this machine's cached
wheels (docker/build.sh), bring the compose cluster up with 2 workers for each
job, check the records, and take down every container, network and volume the
runs made, also after a failure. The image ``commbench:test`` is kept as the
build cache of the next run. Elsewhere the tests are skipped and the reason is
printed as a warning in pytest's summary.

A cold run (base image and image not yet built) takes ~10 min on 2 cores; with
both cached ~2 min.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
import warnings
from pathlib import Path

import pytest

from tests.conftest import ROOT, read_jsonl

pytestmark = pytest.mark.timeout(2400)  # cold: base image + apt + pip + image layers

IMAGE = "commbench:test"
BASE = "commbench-base:bookworm"
COMPOSE_FILE = ROOT / "docker" / "docker-compose.yml"
UP_TIMEOUT = 600  # one compose run: start, SSH, link test, job, stop
FIGURES = {}  # what the run measured, printed at the end (-s) for the issue note


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})}, cwd=ROOT)
    if check and res.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {res.returncode}\n{res.stdout[-4000:]}\n"
                    f"{res.stderr[-4000:]}")
    return res


def _skip(reason: str) -> None:
    warnings.warn(f"tests/test_docker.py skipped: {reason}", stacklevel=2)
    pytest.skip(reason)


def _compose_cmd() -> list[str]:
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    _skip("neither `docker compose` nor docker-compose is installed "
          "(scripts/setup.sh --with-test-deps installs docker-compose)")
    raise AssertionError  # not reached


@pytest.fixture(scope="module")
def daemon():
    """A Docker daemon that answers; started here (and stopped after) if none ran."""
    if os.geteuid() != 0:
        _skip("starting a Docker daemon and building images needs root")
    for tool in ("docker", "dockerd", "debootstrap"):
        if shutil.which(tool) is None:
            _skip(f"{tool} not found (scripts/setup.sh --with-test-deps installs docker.io, "
                  "docker-compose and debootstrap)")
    res = _run([str(ROOT / "docker" / "dockerd.sh"), "start"], timeout=120, check=False)
    if res.returncode != 0:
        _skip(f"no Docker daemon can run here: {res.stderr.strip()[-600:]}")
    started = res.stdout.startswith("started")
    yield
    if started:
        _run([str(ROOT / "docker" / "dockerd.sh"), "stop"], timeout=120, check=False)


@pytest.fixture(scope="module")
def image(daemon):
    """The commbench image, built on the debootstrap base with this machine's wheels."""
    t0 = time.monotonic()
    _run([str(ROOT / "docker" / "make-base-image.sh"), BASE], timeout=900)
    t1 = time.monotonic()
    _run([str(ROOT / "docker" / "build.sh"), "--base", BASE, "--tag", IMAGE], timeout=1800)
    t2 = time.monotonic()
    # A rebuild leaves the previous commbench:test untagged; drop only those.
    _run(["docker", "image", "prune", "-f", "--filter", "label=org.commbench.image"],
         timeout=120, check=False)
    size = _run(["docker", "image", "inspect", IMAGE, "--format", "{{.Size}}"], timeout=60)
    FIGURES.update(base_image_s=round(t1 - t0, 1), image_build_s=round(t2 - t1, 1),
                   image_bytes=int(size.stdout))
    return IMAGE


class Cluster:
    """One compose project; every ``up`` runs the launcher to its end, ``down`` removes all."""

    def __init__(self, compose: list[str], results: Path) -> None:
        self.project = f"cbtest{uuid.uuid4().hex[:8]}"
        self.compose = [*compose, "-f", str(COMPOSE_FILE), "-p", self.project]
        self.results = results

    def env(self, **settings: str) -> dict[str, str]:
        return {"IMAGE": IMAGE, "RESULTS_DIR": str(self.results), **settings}

    def up(self, **settings: str) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        res = _run([*self.compose, "up", "--no-build", "--exit-code-from", "launcher"],
                   timeout=UP_TIMEOUT, env=self.env(**settings), check=False)
        res.seconds = time.monotonic() - t0
        return res

    def running(self) -> list[str]:
        return _run(["docker", "ps", "-q", "--filter",
                     f"label=com.docker.compose.project={self.project}"], timeout=60).stdout.split()

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        out = []
        for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
            ids = _run(["docker", *kind, "-q", "--filter", label], timeout=60).stdout.split()
            out += [f"{kind[0]} {i}" for i in ids]
        return out

    def down(self) -> subprocess.CompletedProcess:
        return _run([*self.compose, "down", "-v", "--remove-orphans", "--timeout", "5"],
                    timeout=300, env=self.env(), check=False)


@pytest.fixture(scope="module")
def cluster(image, tmp_path_factory):
    c = Cluster(_compose_cmd(), tmp_path_factory.mktemp("docker-results"))
    try:
        yield c
    finally:
        c.down()  # containers, network and the key volume, also after a failure


def _summaries(path: Path) -> list[dict]:
    return [r for r in read_jsonl(path) if r["kind"] == "summary"]


STUDY = "--model resnet18 --compute-ms 20 --steps 4 --warmup 1"
RATE_GBPS = 1.0  # the shaped link of the horovodrun test


def test_horovodrun_across_two_containers_on_shaped_links(cluster):
    res = cluster.up(WORKERS="2", SLOTS="2", LAUNCHER="horovodrun", RATE=f"{RATE_GBPS:g}gbit",
                     OUTPUT="hvd.jsonl", ARGS=STUDY)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    summaries = _summaries(cluster.results / "hvd.jsonl")
    assert {s["algo"] for s in summaries} == {"native", "ring"}
    for s in summaries:
        assert s["backend"] == "horovod"
        assert s["world_size"] == 4
        assert s["nodes"] == 2
        assert sorted(set(s["hostnames"])) == ["node1", "node2"]
        assert s["wrong"] == 0
        assert s["link_shaping"] == f"{RATE_GBPS:g}gbit"
        # the launcher measured the shaped link: near its rate, not the bridge's speed
        assert 0.5 * RATE_GBPS < s["link_gbps"] < 1.05 * RATE_GBPS, s["link_gbps"]
        FIGURES[f"hvd_{s['algo']}_busbw_over_link"] = round(
            s["busbw_gbps"] * 8 / s["link_gbps"], 3)
        FIGURES[f"hvd_{s['algo']}_link_efficiency"] = s.get("link_efficiency")
    FIGURES["compose_horovodrun_s"] = round(res.seconds, 1)


def test_mpirun_across_two_containers(cluster):
    res = cluster.up(WORKERS="2", SLOTS="2", LAUNCHER="mpirun", RATE="none",
                     OUTPUT="mpi.jsonl", ARGS=STUDY + " --algo ring")
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    (s,) = _summaries(cluster.results / "mpi.jsonl")
    assert (s["backend"], s["algo"], s["world_size"]) == ("mpi", "ring", 4)
    assert s["nodes"] == 2 and s["local_sizes"] == [2, 2]
    assert sorted(set(s["hostnames"])) == ["node1", "node2"]
    assert s["wrong"] == 0
    assert s["link_shaping"] == "none"
    FIGURES["compose_mpirun_s"] = round(res.seconds, 1)


@pytest.mark.parametrize("settings, message", [
    ({"WORKERS": "0"}, "WORKERS=0: the cluster needs at least one worker node"),
    ({"WORKERS": "2", "SLOTS": "2", "RANKS": "5"}, "RANKS=5 is more ranks than the 4 slots"),
])
def test_bad_settings_stop_the_cluster(cluster, settings, message):
    before = set(os.listdir(cluster.results))
    res = cluster.up(OUTPUT="bad.jsonl", **settings)
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    assert message in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert cluster.running() == []  # compose stopped every node
    assert set(os.listdir(cluster.results)) == before  # no partial output


def test_down_removes_containers_networks_and_volumes(cluster):
    cluster.up(WORKERS="0")  # quick: the launcher refuses, compose stops the nodes
    assert cluster.leftovers()  # stopped containers, the network and the key volume remain
    res = cluster.down()
    assert res.returncode == 0, res.stderr
    assert cluster.leftovers() == []
    print(f"\n# docker figures: {FIGURES}")
