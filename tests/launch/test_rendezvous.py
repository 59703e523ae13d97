"""Tier 1 (pure logic): launcher environment discovery and SLURM host list expansion."""

from __future__ import annotations

import pytest

from commlayer.core.rendezvous import RendezvousEnvError, RendezvousInfo, discover, expand_slurm_nodelist

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29500",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "6",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
    # Open MPI 5 also exports PMIx variables; Open MPI's own must win.
    "PMIX_RANK": "5",
    "PMIX_NAMESPACE": "prterun-host-1@1",
}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "PMI_FD": "7"}
INTEL_MPI = {**MPICH, "I_MPI_HYDRA_UUID": "c2a0-0000", "I_MPI_PIN_MAPPING": "2:0 0,1 1"}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "6",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURM_TASKS_PER_NODE": "2(x3)",
    "SLURM_JOB_NODELIST": "gpu[07-09]",
    "SLURM_JOB_ID": "4242",
}


def info(
    rank: int, world: int, local: int, local_world: int, addr: str | None, port: int | None, source: str
) -> RendezvousInfo:
    return RendezvousInfo(rank, world, local, local_world, addr, port, source)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"PATH": "/usr/bin", "MASTER_ADDR": "h", "MASTER_PORT": "1", "LOCAL_RANK": "0"}, None),
        (TORCHRUN, info(3, 8, 1, 2, "10.0.0.5", 29500, "torchrun")),
        ({"RANK": "0", "WORLD_SIZE": "1"}, info(0, 1, 0, 1, None, None, "torchrun")),
        (OPENMPI, info(5, 6, 2, 3, None, None, "openmpi")),
        (MPICH, info(2, 4, 0, 2, None, None, "mpich")),
        (INTEL_MPI, info(2, 4, 0, 2, None, None, "intel-mpi")),
        ({"PMI_RANK": "1", "PMI_SIZE": "3"}, info(1, 3, 1, 3, None, None, "pmi")),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "3", "PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "1"},
            info(1, 3, 0, 1, None, None, "pmi"),
        ),
        (
            {"PMIX_RANK": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"},
            info(3, 4, 1, 2, None, None, "pmix"),
        ),
        (SLURM, info(5, 6, 1, 2, "gpu07", None, "slurm")),
    ],
    ids=[
        "empty",
        "unrelated",
        "torchrun",
        "torchrun-minimal",
        "openmpi",
        "mpich",
        "intel-mpi",
        "pmi",
        "pmi-local",
        "pmix-under-srun",
        "slurm",
    ],
)
def test_discover_each_launcher(environ: dict[str, str], expected: RendezvousInfo | None) -> None:
    assert discover(environ) == expected


def test_torchrun_variables_win_over_mpi_and_slurm() -> None:
    environ = {**SLURM, **OPENMPI, **INTEL_MPI, "RANK": "1", "WORLD_SIZE": "2"}
    assert discover(environ) == info(1, 2, 1, 2, None, None, "torchrun")


def test_mpi_launchers_win_over_slurm() -> None:
    assert discover({**SLURM, **OPENMPI}).source == "openmpi"
    assert discover({**SLURM, **MPICH}).source == "mpich"
    # srun --mpi=pmi2 exports PMI_RANK without Hydra's locals: srun's own local variables fill in.
    pmi_under_srun = discover({**SLURM, "PMI_RANK": "4", "PMI_SIZE": "6"})
    assert pmi_under_srun == info(4, 6, 1, 2, None, None, "pmi")


def test_master_variables_override_every_launcher() -> None:
    override = {"MASTER_ADDR": "head.cluster", "MASTER_PORT": "41000"}
    for environ in (OPENMPI, MPICH, SLURM, TORCHRUN):
        found = discover({**environ, **override})
        assert (found.master_addr, found.master_port) == ("head.cluster", 41000)


def test_slurm_master_comes_from_the_most_specific_nodelist() -> None:
    environ = {**SLURM, "SLURM_NODELIST": "cn[100-101]", "SLURM_STEP_NODELIST": "cn[003,005]"}
    assert discover(environ).master_addr == "cn003"
    assert discover({**SLURM, "SLURM_NODELIST": "cn[100-101]"}).master_addr == "cn100"
    no_nodelist = {key: value for key, value in SLURM.items() if key != "SLURM_JOB_NODELIST"}
    assert discover(no_nodelist).master_addr is None


@pytest.mark.parametrize(
    ("tasks", "node", "expected_local_world"),
    [("4", "0", 4), ("2(x3)", "2", 2), ("3,2(x2),1", "0", 3), ("3,2(x2),1", "2", 2), ("3,2(x2),1", "3", 1)],
)
def test_slurm_tasks_per_node_forms(tasks: str, node: str, expected_local_world: int) -> None:
    environ = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": node,
        "SLURM_TASKS_PER_NODE": tasks,
    }
    assert discover(environ).local_world_size == expected_local_world


def test_slurm_tasks_per_node_precedence_and_missing_node_id() -> None:
    base = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0"}
    both = {
        **base,
        "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
    }
    assert discover(both).local_world_size == 2
    assert discover({**base, "SLURM_NTASKS_PER_NODE": "4"}).local_world_size == 4
    # Uniform lists need no node index; uneven ones do.
    assert discover({**base, "SLURM_TASKS_PER_NODE": "4(x2)"}).local_world_size == 4
    with pytest.raises(RendezvousEnvError, match="SLURM_NODEID"):
        discover({**base, "SLURM_TASKS_PER_NODE": "5,3"})


def test_slurm_without_ntasks_uses_nprocs() -> None:
    environ = {"SLURM_PROCID": "2", "SLURM_NPROCS": "3"}
    assert discover(environ) == info(2, 3, 2, 3, None, None, "slurm")


@pytest.mark.parametrize(
    ("environ", "variable", "received"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK", "'x'"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK", "'-1'"),
        ({"RANK": " 1", "WORLD_SIZE": "2"}, "RANK", "' 1'"),
        ({"RANK": "", "WORLD_SIZE": "2"}, "RANK", "''"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK", "'2'"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE", "'0'"),
        ({"RANK": "0"}, "WORLD_SIZE", "unset"),
        ({"WORLD_SIZE": "4"}, "RANK", "unset"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK", "'2'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE", "'3'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT", "'70000'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "0"}, "MASTER_PORT", "'0'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT", "'http'"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": ""}, "MASTER_ADDR", "''"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a b"}, "MASTER_ADDR", "'a b'"),
        ({**OPENMPI, "OMPI_COMM_WORLD_SIZE": "5"}, "OMPI_COMM_WORLD_RANK", "'5'"),
        (
            {k: v for k, v in OPENMPI.items() if k != "OMPI_COMM_WORLD_LOCAL_SIZE"},
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "unset",
        ),
        ({**MPICH, "MPI_LOCALNRANKS": "two"}, "MPI_LOCALNRANKS", "'two'"),
        ({**MPICH, "PMI_SIZE": "2"}, "PMI_RANK", "'2'"),
        ({"PMI_RANK": "0"}, "PMI_SIZE", "unset"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_LOCAL_RANK": "0"}, "PMI_LOCAL_SIZE", "unset"),
        ({"PMIX_RANK": "0"}, "SLURM_NTASKS", "unset"),
        ({**SLURM, "SLURM_PROCID": "6"}, "SLURM_PROCID", "'6'"),
        ({**SLURM, "SLURM_LOCALID": "2"}, "SLURM_LOCALID", "'2'"),
        ({**SLURM, "SLURM_NODEID": "3"}, "SLURM_NODEID", "'3'"),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "2(x)"}, "SLURM_TASKS_PER_NODE", "'2(x)'"),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "0(x3)"}, "SLURM_TASKS_PER_NODE", "'0(x3)'"),
        ({k: v for k, v in SLURM.items() if k != "SLURM_TASKS_PER_NODE"}, "SLURM_TASKS_PER_NODE", "unset"),
        ({**SLURM, "SLURM_JOB_NODELIST": "gpu[07-09"}, "SLURM_JOB_NODELIST", "'gpu[07-09'"),
    ],
)
def test_malformed_values_name_variable_expectation_and_value(
    environ: dict[str, str], variable: str, received: str
) -> None:
    with pytest.raises(RendezvousEnvError) as caught:
        discover(environ)
    error = caught.value
    assert error.variable == variable
    assert str(error).startswith(f"launcher environment variable {variable}: expected ")
    assert received in str(error)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node[9-11]", ["node9", "node10", "node11"]),
        ("node[008-010]", ["node008", "node009", "node010"]),
        ("a[1-2]b", ["a1b", "a2b"]),
        ("r[1-2]n[5,7]", ["r1n5", "r1n7", "r2n5", "r2n7"]),
        ("x[3],gpu-[1-2].ib,login", ["x3", "gpu-1.ib", "gpu-2.ib", "login"]),
        ("c[5]", ["c5"]),
    ],
)
def test_expand_slurm_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_slurm_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist",
    [
        "",
        "a,,b",
        "a,",
        "n[1-2",
        "n]1",
        "n[[1]]",
        "n[]",
        "n[3-1]",
        "n[a-b]",
        "n[1-]",
        "n[-2]",
        "n[1,,2]",
        "n[1-2-3]",
    ],
)
def test_expand_slurm_nodelist_rejects_malformed(nodelist: str) -> None:
    with pytest.raises(RendezvousEnvError) as caught:
        expand_slurm_nodelist(nodelist, variable="SLURM_JOB_NODELIST")
    assert caught.value.variable == "SLURM_JOB_NODELIST"
    assert caught.value.received == nodelist
