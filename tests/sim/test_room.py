"""A calibrated machine's platform (its devices worker processes) holds more workers than it has
as that machine runs them, more processes a host; a platform of hardware devices does not
(:func:`psgdlab.sim.workload.with_room_for`); ``calibrate`` takes the machine's devices from the
runs' ``env.json`` (:func:`psgdlab.analysis.cores.devices_of`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.analysis.cores import devices_of
from psgdlab.cli import main
from psgdlab.core.errors import ConfigError
from psgdlab.core.platform.profile import PROCESS_DEVICE, HostCPU, Platform, Profile, Workload
from psgdlab.sim.platform import Placement
from psgdlab.sim.predict import predict_one, predict_sweep
from psgdlab.sim.workload import load_config, with_room_for


def calibrated(hosts: int = 1, devices: int = 2, host_cpu: HostCPU | None = None) -> Profile:
    platform = Platform(
        name="calibrated",
        hosts=hosts,
        devices_per_host=devices,
        sockets_per_host=devices,
        device=PROCESS_DEVICE,
        host_cpu=host_cpu,
    )
    return Profile(platform=platform, workload=Workload(n_params=1000, compute="0.01", batch_per_worker=1))


@given(hosts=st.integers(1, 4), devices=st.integers(1, 8), workers=st.integers(1, 64))
def test_a_process_platform_holds_any_workers_in_blocks_of_its_hosts(hosts, devices, workers):
    roomy, said = with_room_for(calibrated(hosts, devices), workers)
    p = roomy.platform
    assert p.hosts == hosts and p.devices_per_host >= devices and p.hosts * p.devices_per_host >= workers
    assert p.sockets_per_host == p.devices_per_host  # every worker behind its own link, as calibrated
    assert (said is None) == (workers <= hosts * devices or -(-workers // hosts) <= devices)
    if said is None:
        assert roomy is not None and roomy.platform == calibrated(hosts, devices).platform


def test_a_platform_of_gpus_is_never_stretched():
    preset = load_config(preset="h100-sxm-ndr")
    assert with_room_for(preset, 128) == (preset, None)
    with pytest.raises(ConfigError, match=r"workers \(128\) need 16 hosts of 8 devices but .* has 8 hosts"):
        predict_one("ssgd", 128, preset, steps=5, intervals=False)


def test_the_line_says_whether_the_shared_cores_are_priced():
    _, bare = with_room_for(calibrated(), 4)
    assert bare is not None and "the cores they share are not priced" in bare
    cpu = HostCPU(cores_per_host=2, work_per_message_s=1e-4, work_per_byte_s=1e-9)
    _, priced = with_room_for(calibrated(host_cpu=cpu), 4)
    assert priced is not None and "(2 a host) priced by [platform.host_cpu]" in priced
    # the cores stay the machine's: more processes share them
    assert with_room_for(calibrated(host_cpu=cpu), 4)[0].platform.host_cpu == cpu


def test_predict_runs_more_workers_than_the_calibrated_machine_has_and_says_so(tmp_path, capsys):
    path = tmp_path / "calibrated.toml"
    path.write_text(calibrated().to_toml())
    argv = ["predict", "--platform", str(path), "--algorithm", "ssgd", "--workers", "2,4", "--steps", "20"]
    assert main([*argv, "--json", "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)["rows"]
    assert [r["workers"] for r in rows] == [2, 4] and rows[1]["node_shape"] == "1x4"
    assert "calibrated: 1 host of 2 worker processes (as calibrated) runs 4 workers as 4 processes a host" in out.err


@given(hosts=st.integers(1, 4), devices=st.integers(1, 8), workers=st.integers(1, 64))
def test_the_placement_on_a_stretched_platform_is_the_calibrated_one_where_the_workers_fit(hosts, devices, workers):
    profile = calibrated(hosts, devices)
    placed = Placement.pack(with_room_for(profile, workers)[0].platform, workers)
    fits = workers <= hosts * devices
    # as calibrated where they fit; else in blocks of ceil(workers / hosts), srun's block distribution
    per_host = min(devices, workers) if fits else -(-workers // hosts)
    assert placed.per_host == per_host and placed.host == tuple(r // per_host for r in range(workers))
    assert max(placed.per_socket) == 1  # every process behind its own link, as calibrated
    if fits:
        assert placed == Placement.pack(profile.platform, workers)


def test_a_sweep_places_each_case_by_itself_not_by_its_largest():
    profile = calibrated(hosts=2, devices=2)
    alone = predict_sweep(profile, ("ssgd",), (4,), steps=10, jobs=1, intervals=False)
    swept = predict_sweep(profile, ("ssgd",), (4, 8), steps=10, jobs=1, intervals=False)
    # 4 workers cross the two calibrated hosts (2x2) however many the sweep's largest case needs
    assert [r.row.node_shape for r in swept] == ["2x2", "2x4"] and alone[0].row.node_shape == "2x2"
    assert swept[0].row.samples_per_s == alone[0].row.samples_per_s


@pytest.mark.parametrize(
    ("envs", "devices"),
    [
        ([{"backend": "gloo", "cpu_count": 2, "gpus": 0}] * 2, 2),
        ([{"backend": "mpi", "cpu_count": 16}], 16),
        ([{"backend": "nccl", "cpu_count": 64, "gpus": 8}], 8),
        ([{"backend": "gloo"}], None),
    ],
)
def test_the_machine_s_devices_are_its_cores_or_for_nccl_its_gpus(envs, devices):
    assert devices_of(envs) == devices


def test_runs_of_different_machines_are_refused():
    with pytest.raises(ConfigError, match=r"different devices \[2, 4\]; calibrate one machine at a time"):
        devices_of([{"cpu_count": 2}, {"cpu_count": 4}])


def test_a_calibrated_profile_round_trips_with_its_process_devices(tmp_path):
    profile = dataclasses.replace(calibrated(), uncertainty=None)
    path = tmp_path / "c.toml"
    path.write_text(profile.to_toml())
    assert Profile.read(path).platform.device == PROCESS_DEVICE
