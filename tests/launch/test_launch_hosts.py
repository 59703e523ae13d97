"""`commlayer run --hostfile` without running anything (tier 1): hostfiles, filters, the exported
environment, the ssh/pdsh/mpirun/srun command lines, the agent's rank layout and root-cause choice."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from commlayer import cli
from commlayer.launch import ProcessOutcome
from commlayer.launch.agent import rank_specs
from commlayer.launch.commands import JobPlan, mpirun_argv, pdsh_argv, srun_argv, ssh_argv
from commlayer.launch.environment import exported_environment, find_env_file, parse_env_file
from commlayer.launch.hostfile import HostfileError, HostSlots, parse_hostfile, select_hosts
from commlayer.launch.multinode import first_rank_failure
from commlayer.launch.supervise import LaunchResult

HOSTFILE = """
# two nodes
node1 slots=4
node2 slots=2   # the small one
"""


def hosts(*layout: tuple[str, tuple[int, ...]]) -> list[HostSlots]:
    return [HostSlots(host, slots) for host, slots in layout]


def plan(**fields: object) -> JobPlan:
    defaults: dict[str, object] = {
        "hosts": tuple(hosts(("node1", (0, 1)), ("node2", (0, 1)))),
        "program": ("/venv/bin/python", "-u", "train.py", "--lr", "0.1"),
        "master_addr": "node1",
        "master_port": 29500,
        "exported": {"NCCL_DEBUG": "INFO", "COMMLAYER_X": "a b"},
        "cwd": "/job dir",
        "ssh": ("ssh", "-F", "/k/cfg"),
        "python": "/venv/bin/python",
    }
    return JobPlan(**{**defaults, **fields})  # type: ignore[arg-type]


def test_hostfile_lines_comments_and_slots() -> None:
    assert parse_hostfile(HOSTFILE) == hosts(("node1", (0, 1, 2, 3)), ("node2", (0, 1)))


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("node1 slots=0", "expected 'HOST slots=N' with N >= 1, received 'node1 slots=0'"),
        ("node1", "expected 'HOST slots=N'"),
        ("a slots=1\na slots=2", "host 'a' is listed twice"),
        ("# nothing", "expected at least one"),
    ],
)
def test_bad_hostfiles_name_line_and_content(text: str, complaint: str) -> None:
    with pytest.raises(HostfileError, match=complaint):
        parse_hostfile(text, "hf")


@pytest.mark.parametrize(
    ("include", "exclude", "expected"),
    [
        ("node1:0,1@node2", None, [("node1", (0, 1)), ("node2", (0, 1))]),
        ("node2", None, [("node2", (0, 1))]),
        (None, "node1:1,3", [("node1", (0, 2)), ("node2", (0, 1))]),
        (None, "node1", [("node2", (0, 1))]),
        (None, None, [("node1", (0, 1, 2, 3)), ("node2", (0, 1))]),
    ],
)
def test_include_and_exclude_filters(include: str | None, exclude: str | None, expected: list) -> None:
    assert select_hosts(parse_hostfile(HOSTFILE), include, exclude) == hosts(*expected)


@pytest.mark.parametrize(
    ("include", "exclude", "complaint"),
    [
        ("node3", None, "names host 'node3', which the hostfile does not list"),
        ("node2:5", None, r"expected slots of 'node2' in 0..1, received \[5\]"),
        ("node1:x", None, "argument '--include' expected 'host"),
        (None, "node1@node2", "leave no host and slot"),
        ("node1", "node2", "exclusive"),
    ],
)
def test_bad_filters(include: str | None, exclude: str | None, complaint: str) -> None:
    with pytest.raises(HostfileError, match=complaint):
        select_hosts(parse_hostfile(HOSTFILE), include, exclude)


def test_exported_environment_prefixes_and_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / ".commlayer_env"
    env_file.write_text("# settings\nHF_HOME = /shared/cache\nNCCL_DEBUG=WARN\n", encoding="utf-8")
    environ = {
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/src",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "0",
        "I_MPI_X": "1",
    }
    exported = exported_environment(environ, find_env_file(tmp_path, tmp_path / "none"))
    assert exported == {
        "NCCL_DEBUG": "WARN",
        "PYTHONPATH": "/src",
        "CUDA_VISIBLE_DEVICES": "0",
        "I_MPI_X": "1",
        "HF_HOME": "/shared/cache",
    }
    assert find_env_file(tmp_path / "a", tmp_path / "b") is None
    with pytest.raises(ValueError, match=r"f:2: expected 'NAME=VALUE', received 'oops'"):
        parse_env_file("A=1\noops", "f")


def test_ssh_line_enters_the_directory_exports_and_starts_the_agent() -> None:
    argv = ssh_argv(plan(), 1)
    assert argv[:6] == ["ssh", "-F", "/k/cfg", "-o", "BatchMode=yes", "node2"]
    words = shlex.split(argv[6])
    assert words[:5] == ["cd", "/job dir", "&&", "exec", "env"]
    assert {"COMMLAYER_X=a b", "MASTER_ADDR=node1", "MASTER_PORT=29500", "NCCL_DEBUG=INFO"} <= set(words)
    agent = words[words.index("/venv/bin/python") :]
    assert agent[:8] == [
        "/venv/bin/python", "-u", "-m", "commlayer.launch.agent",
        "--hosts=node1:0,1@node2:0,1", "--node-rank=1", "--watch-stdin", "--",
    ]  # fmt: skip
    assert agent[8:] == ["/venv/bin/python", "-u", "train.py", "--lr", "0.1"]


def test_pdsh_line_uses_pdsh_node_index_and_ssh_options() -> None:
    argv, extra = pdsh_argv(plan())
    assert argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "node1,node2"]
    assert "--node-rank=%n" in shlex.split(argv[6]) and "--watch-stdin" not in argv[6]
    assert extra == {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": "-F /k/cfg -o BatchMode=yes"}


def test_open_mpi_and_hydra_lines() -> None:
    uneven = plan(hosts=tuple(hosts(("node1", (0, 1, 2)), ("node2", (0,)))))
    ompi = mpirun_argv(uneven, "openmpi", "/venv/bin/mpirun")
    assert ompi[:5] == ["/venv/bin/mpirun", "-n", "4", "--host", "node1:3,node2:1"]
    assert ["--mca", "plm_rsh_agent", "ssh -F /k/cfg"] == ompi[ompi.index("--mca") : ompi.index("--mca") + 3]
    assert ["-x", "MASTER_ADDR=node1"] == ompi[
        ompi.index("MASTER_ADDR=node1") - 1 : ompi.index("MASTER_ADDR=node1") + 1
    ]
    assert ompi[-5:] == ["/venv/bin/python", "-u", "train.py", "--lr", "0.1"]
    hydra = mpirun_argv(uneven, "hydra", "mpiexec.hydra")
    assert hydra[:6] == ["mpiexec.hydra", "-n", "4", "-hosts", "node1:3,node2:1", "-l"]
    assert ["-launcher", "ssh", "-launcher-exec", "ssh", "-bootstrap-exec-args", "-F /k/cfg"] == hydra[6:12]
    assert ["-genv", "MASTER_PORT", "29500"] == hydra[
        hydra.index("MASTER_PORT") - 1 : hydra.index("MASTER_PORT") + 2
    ]


def test_srun_line_and_its_even_layout_rule() -> None:
    argv = srun_argv(plan())
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--nodelist=node1,node2"]
    assert "--export=ALL,COMMLAYER_X=a b,MASTER_ADDR=node1,MASTER_PORT=29500,NCCL_DEBUG=INFO" in argv
    with pytest.raises(ValueError, match="same number of ranks on every host"):
        srun_argv(plan(hosts=tuple(hosts(("node1", (0, 1, 2)), ("node2", (0,))))))


def test_agent_places_consecutive_ranks_and_keeps_filtered_slots() -> None:
    layout = hosts(("node1", (0, 1)), ("node2", (1, 3)))
    specs = rank_specs(layout, 1, ("prog",), {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert [spec.label for spec in specs] == ["rank 2 on node2", "rank 3 on node2"]
    assert [spec.tag for spec in specs] == ["[node2 rank2] ", "[node2 rank3] "]
    env = specs[1].env
    picked = {
        name: env[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    }
    assert picked == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["CUDA_VISIBLE_DEVICES"]) == (
        "10.0.0.1",
        "1234",
        "1,3",
    )


def test_root_cause_is_the_earliest_report_of_a_host_that_failed_by_itself() -> None:
    def host(label: str, code: int, stopped: bool, at: float | None) -> ProcessOutcome:
        line = f"commlayer run on {label}: rank on {label} exited with code {code}; stopped 1 other rank [at {at}]"
        return ProcessOutcome(label, code, stopped, ("noise",) + ((line,) if at else ()))

    result = LaunchResult(
        (host("a", 1, False, 20.5), host("b", 137, False, 20.25), host("c", -15, True, 1.0)), first_failure=0
    )
    assert first_rank_failure(result) == ("rank on b exited with code 137", 137)
    assert first_rank_failure(LaunchResult((host("a", 0, False, None),))) is None


def test_cli_refuses_host_options_without_a_hostfile_and_bad_hostfiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--include", "a", "x.py"]) == 2
    assert "--include expected together with --hostfile" in capsys.readouterr().err
    assert cli.main(["run", "--launcher", "ssh", "x.py"]) == 2  # mpirun alone starts local ranks
    assert "--launcher ssh expected together with --hostfile" in capsys.readouterr().err
    assert cli.main(["run", "--hostfile", str(tmp_path / "missing"), "x.py"]) == 2
    assert "argument '--hostfile' expected a readable file" in capsys.readouterr().err
    hostfile = tmp_path / "hf"
    hostfile.write_text("a slots=1\n", encoding="utf-8")
    assert cli.main(["run", "--hostfile", str(hostfile), "-n", "2", "x.py"]) == 2
    assert "argument '-n' expected at most the 1 slots of 'a', received 2" in capsys.readouterr().err


def test_an_ft_job_keeps_each_member_under_a_slot_keeper_on_every_path() -> None:
    ft = plan(ft_max_restarts=2)
    words = shlex.split(ssh_argv(ft, 0)[-1])
    assert "--ft-max-restarts=2" in words and words.index("--ft-max-restarts=2") < words.index("--")
    argv = srun_argv(ft)
    keeper = argv.index("commlayer.launch.slot_keeper")
    assert "--no-kill" in argv[:keeper] and argv[keeper + 1 : keeper + 3] == ["--max-restarts", "2"]
    assert argv[-5:] == ["/venv/bin/python", "-u", "train.py", "--lr", "0.1"]
    specs = rank_specs(hosts(("node1", (0,)), ("node2", (0,))), 1, ("prog",), {}, ft_max_restarts=2)
    assert specs[0].argv[-6:] == ("--max-restarts", "2", "--label", "rank 1 on node2", "--", "prog")
