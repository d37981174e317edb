"""A task of Slurm's ``srun`` finds its rank, world size, local rank and the rendezvous of
torch.distributed from Slurm's variables (:mod:`psgdlab.runtime.transports.env`); Slurm's
hostlist syntax is expanded as ``scontrol show hostnames`` does (the daemons' test,
``test_slurm.py``, also asks the real ``scontrol``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psgdlab.core.errors import ConfigError
from psgdlab.runtime.transports.env import (
    SLURM_PORT_BASE,
    SLURM_PORT_SPAN,
    LaunchEnv,
    expand_hostlist,
    launch_env,
    slurm_rendezvous,
)

#: what srun gives task 3 of 4 on the second of two nodes of job 4242's step 1 (block distribution)
TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "1",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "gpu08",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08],cpu1",
    "SLURM_NODELIST": "gpu[07-08],cpu1",
}


def test_a_task_of_srun_finds_its_place_and_the_rendezvous_from_slurm():
    env = launch_env(TASK)
    port = SLURM_PORT_BASE + (16 * 4242 + 1) % SLURM_PORT_SPAN
    assert env == LaunchEnv(rank=3, world_size=4, local_rank=1, launcher="slurm", master=("gpu07", port))


def test_the_steps_of_a_job_and_consecutive_jobs_get_distinct_ports():
    ports = {
        slurm_rendezvous({**TASK, "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": str(step)})[1]  # type: ignore[index]
        for job in range(1000, 1100)
        for step in range(16)
    }
    assert len(ports) == 100 * 16
    assert all(SLURM_PORT_BASE <= p < SLURM_PORT_BASE + SLURM_PORT_SPAN < 32768 for p in ports)


def test_the_step_node_list_comes_first_then_the_job_s():
    assert slurm_rendezvous(TASK)[0] == "gpu07"  # type: ignore[index]
    job_only = {k: v for k, v in TASK.items() if k != "SLURM_STEP_NODELIST"}
    job_only["SLURM_JOB_NODELIST"] = "cpu[3-4]"
    assert slurm_rendezvous(job_only)[0] == "cpu3"  # type: ignore[index]


def test_what_the_user_exported_wins():
    both = {**TASK, "MASTER_ADDR": "login2", "MASTER_PORT": "29500"}
    assert slurm_rendezvous(both) is None and launch_env(both).master is None
    # one of them: the other is derived (the transport keeps the exported one: setdefault)
    assert slurm_rendezvous({**TASK, "MASTER_PORT": "29500"})[0] == "gpu07"  # type: ignore[index]


def test_torchrun_and_mpi_under_srun_keep_their_ranks_and_get_the_slurm_rendezvous():
    # srun --mpi=pmi2: Slurm's PMI sets PMI_RANK/PMI_SIZE beside SLURM_PROCID
    pmi = launch_env({**TASK, "PMI_RANK": "3", "PMI_SIZE": "4"})
    assert (pmi.launcher, pmi.rank, pmi.master is not None) == ("mpi", 3, True)
    # torchrun under srun exports its own rendezvous
    torchrun = launch_env(
        {**TASK, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07", "MASTER_PORT": "29400"}
    )
    assert (torchrun.launcher, torchrun.rank, torchrun.master) == ("torchrun", 5, None)


def test_the_batch_script_is_one_process_not_a_task_of_srun():
    # sbatch's script has SLURM_PROCID=0 and SLURM_NTASKS of the job, but no step id
    batch = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "vm"}
    assert launch_env(batch) == LaunchEnv(rank=0, world_size=1, local_rank=0, launcher="slurm-batch")


def test_rank_0_off_the_first_node_is_refused_while_the_rendezvous_is_derived():
    off = {**TASK, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "gpu08"}
    with pytest.raises(ConfigError, match=r"rank 0 runs on node gpu08, not on gpu07.*export MASTER_ADDR"):
        launch_env(off)
    exported = {**off, "MASTER_ADDR": "gpu08", "MASTER_PORT": "29500"}
    assert launch_env(exported).rank == 0


def test_slurm_variables_that_are_not_integers_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"SLURM_PROCID='x'"):
        launch_env({**TASK, "SLURM_PROCID": "x"})
    with pytest.raises(ConfigError, match=r"SLURM_JOB_ID='x1'"):
        slurm_rendezvous({**TASK, "SLURM_JOB_ID": "x1"})


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [  # each as `scontrol show hostnames` of Slurm 22.05 printed it
        ("vm", ["vm"]),
        ("gpu[01-03,7],login1", ["gpu01", "gpu02", "gpu03", "gpu7", "login1"]),
        ("n[8-011]", ["n8", "n9", "n10", "n11"]),
        ("n[08-9]", ["n08", "n09"]),
        ("z[098-101]", ["z098", "z099", "z100", "z101"]),
        ("a[1-2]-b[01-02]", ["a1-b01", "a1-b02", "a2-b01", "a2-b02"]),
        ("p[1,3-4],q", ["p1", "p3", "p4", "q"]),
    ],
)
def test_hostlists_expand_as_scontrol_does(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["", "a,,b", "a[1-2", "a]", "a[[1]]", "a[3-1]", "a[x]", "a[1-]"])
def test_a_hostlist_that_is_not_slurm_s_is_refused_in_one_line(bad):
    with pytest.raises(ConfigError, match=r"^hostlist \(.*\) (is not Slurm's syntax|has a range)"):
        expand_hostlist(bad)


@given(
    prefix=st.text(alphabet="abcxyz-", min_size=1, max_size=6).filter(lambda s: not s[-1].isdigit()),
    low=st.integers(0, 500),
    count=st.integers(1, 40),
    width=st.integers(1, 4),
)
def test_a_padded_range_is_every_number_at_the_first_bound_s_width(prefix, low, count, width):
    high = low + count - 1
    text = f"{prefix}[{low:0{width}d}-{high:0{width}d}]"
    expected = [f"{prefix}{n:0{len(f'{low:0{width}d}')}d}" for n in range(low, high + 1)]
    assert expand_hostlist(text) == expected


@given(st.lists(st.tuples(st.sampled_from(["n", "gpu", "r1n"]), st.integers(0, 99), st.integers(0, 5)), min_size=1))
def test_items_concatenate_in_order(ranges):
    items = [f"{p}[{lo}-{lo + k}]" for p, lo, k in ranges]
    assert expand_hostlist(",".join(items)) == [h for item in items for h in expand_hostlist(item)]
