"""The presets of today's clusters: what NVSwitch, GPUDirect RDMA and PCIe nodes mean in the
schema, and priors wide enough to say "uncalibrated"."""

from __future__ import annotations

import pytest

from psgdlab.core.platform.workloads import workload
from psgdlab.sim.network import Network
from psgdlab.sim.platform import Placement
from psgdlab.sim.workload import load_config

NVSWITCH = ("a100-sxm-hdr", "h100-sxm-ndr")
TODAY = (*NVSWITCH, "l40s-pcie-100gbe")


@pytest.mark.parametrize("name", TODAY)
def test_a_64_gpu_cluster_that_trains_the_named_transformer(name):
    cfg = load_config(preset=name)
    p = cfg.platform
    assert (p.hosts, p.devices_per_host) == (8, 8)
    assert cfg.workload.name == "conformer-120m"
    # the preset's workload is the catalog's, its compute set by the device's law
    assert cfg.workload.n_params == workload("conformer-120m").n_params
    assert cfg.device_law and cfg.workload.compute != workload("conformer-120m").compute
    # GPUDirect: nothing is staged through host memory, a message between nodes leaves from the GPU
    assert (p.staging, p.endpoints) == ("direct", "device")
    # no link is shared by the GPUs of a node: each has its own PCIe link
    assert p.sockets_per_host == p.devices_per_host and p.socket_link is None


@pytest.mark.parametrize("name", TODAY)
def test_uncalibrated_priors_are_wide(name):
    """Every value of the [uncertainty] table is a prior the data never pinned, and the compute
    efficiency's spread is at least a factor 1.6 at one sd: the 90 % intervals of a step time are
    wide (at least a factor 2 each way)."""
    u = load_config(preset=name).uncertainty
    assert u is not None and set(u.unpinned) == set(u.parameters)
    sd = dict(zip(u.parameters, u.log_sd))
    assert sd["platform.compute_efficiency"] >= 0.5
    assert {"platform.nic.efficiency", "platform.pcie.efficiency"} <= set(sd)
    assert u.noise_cv > 0


@pytest.mark.parametrize("name", NVSWITCH)
def test_nvswitch_gives_every_pair_the_full_rate(name):
    """On NVSwitch every pair of GPUs of a node talks at NVLink's rate at once: four pairwise
    transfers that start together each take as long as one alone."""
    cfg = load_config(preset=name)
    net = Network(cfg.platform, Placement.pack(cfg.platform, 8))
    alone = net.transfer_s(0, 1, 1e8, 0.0)
    together = [net.transfer_s(a, b, 1e8, 1.0) for a, b in ((0, 1), (2, 3), (4, 5), (6, 7))]
    nv = cfg.platform.nvlink
    assert alone == pytest.approx(nv.latency_s + 1e8 / nv.effective_bandwidth_bytes_per_s)
    assert together == pytest.approx([alone] * 4)


def test_the_pcie_node_shares_its_one_nic():
    """A ring between two L40S nodes runs at the one port's rate; on the H100 nodes the eight
    rails make NVLink the ring's bound."""
    for name, bound in (("l40s-pcie-100gbe", "nic"), ("h100-sxm-ndr", "nvlink")):
        cfg = load_config(preset=name)
        net = Network(cfg.platform, Placement.pack(cfg.platform, 16))
        S, n = 4e9, 16  # latency rounds: under 1 % of the time
        link = getattr(cfg.platform, bound)
        t = net.allreduce_s(tuple(range(n)), S, 0.0)
        assert 2 * (n - 1) / n * S / t == pytest.approx(link.effective_bandwidth_bytes_per_s, rel=0.01)
