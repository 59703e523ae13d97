"""Where `commlayer.ft` finds its store and slot: the launcher's variables (pure logic)."""

from __future__ import annotations

import pytest

from commlayer.core.errors import RendezvousEnvError
from commlayer.ft import FaultToleranceOptions
from commlayer.ft.environment import JobEnvironment, job_environment, job_prefix

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
}


def test_commlayer_run_ft_names_its_store_slot_restart_and_channel() -> None:
    environ = {
        **TORCHRUN,
        "COMMLAYER_FT_STORE": "10.0.0.9:4242",
        "COMMLAYER_FT_SLOT_RESTART": "2",
        "COMMLAYER_FT_CHANNEL": "7",
    }
    found = job_environment(environ)
    assert found == JobEnvironment("10.0.0.9", 4242, False, 3, 4, "commlayer run --ft", 0, 2, 7)
    assert found.restarts_members and found.note is None and found.prefix_of("ft") == "ft"


def test_commlayer_run_ft_under_mpirun_restarts_whole_jobs_with_fresh_keys() -> None:
    # `import torch` copies MPI's variables into RANK/WORLD_SIZE; MPI's own still tell.
    environ = {**OPENMPI, **TORCHRUN, "COMMLAYER_FT_STORE": "h:1", "TORCHELASTIC_RESTART_COUNT": "1"}
    found = job_environment(environ)
    assert found.launcher == "commlayer run --ft (mpirun)" and not found.restarts_members
    assert found.prefix_of("ft") == "ft/restart1" == job_prefix("ft", 1)


def test_torchrun_uses_its_agents_store_and_says_what_a_death_does() -> None:
    environ = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
    found = job_environment(environ)
    assert (found.store_host, found.store_port, found.hosts_store) == ("10.0.0.1", 29500, False)
    assert found.launcher == "torchrun" and found.prefix_of("ft") == "ft/restart2"
    assert (
        found.note is not None
        and "restarts every member" in found.note
        and "commlayer run --ft" in found.note
    )


def test_a_bare_mpirun_has_rank_0_host_the_store_and_says_mpi_cannot_survive_a_death() -> None:
    found = job_environment({**OPENMPI, "MASTER_ADDR": "n1", "MASTER_PORT": "5000"})
    assert (found.launcher, found.member, found.hosts_store) == ("mpirun", 2, False)
    assert job_environment(
        {**OPENMPI, "OMPI_COMM_WORLD_RANK": "0", "MASTER_ADDR": "n1", "MASTER_PORT": "5"}
    ).hosts_store
    assert "MPI without ULFM cannot survive a death" in (found.note or "")


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        ({}, "start the job with `commlayer run --ft`"),
        (TORCHRUN, "a plain `commlayer run` stops every member when one dies"),
        ({**TORCHRUN, "COMMLAYER_FT_STORE": "no-port"}, "expected HOST:PORT, received 'no-port'"),
    ],
)
def test_no_launcher_that_runs_ft_jobs_is_a_clear_error(environ: dict[str, str], match: str) -> None:
    with pytest.raises(RendezvousEnvError, match=match):
        job_environment(environ)


def test_replicas_follow_from_the_launchers_world_size() -> None:
    assert FaultToleranceOptions(shards=2).for_world(6).replicas == 3
    with pytest.raises(ValueError, match="expected the launcher's 5 members to be replicas x shards"):
        FaultToleranceOptions(shards=2).for_world(5)
    with pytest.raises(ValueError, match="replicas is unknown until the Manager reads"):
        _ = FaultToleranceOptions(shards=2).members
