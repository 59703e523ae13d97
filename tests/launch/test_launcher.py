"""`commlayer run` and launch(): tier 1 (config, summaries, CLI parsing) and tier 3 (real processes).

The rank program is tests/launch/launcher_ranks.py, plain Python, so each world starts in well
under a second; only the tests that need a separate launcher process (signals, console script)
pay for importing commlayer in a subprocess.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from commlayer import cli
from commlayer.core.ports import free_port
from commlayer.launch import LaunchConfig, LaunchResult, ProcessOutcome, SuperviseOptions, launch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "launch" / "launcher_ranks.py")
SUBPROCESS_TIMEOUT = 120


def env_line(rank: int, world: int, port: int | str, args: str) -> str:
    return (
        f"[rank{rank}] env RANK={rank} WORLD_SIZE={world} LOCAL_RANK={rank} LOCAL_WORLD_SIZE={world} "
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} PYTHONUNBUFFERED=1 args={args}"
    )


# ---- tier 1: configuration, results and argument parsing -------------------------------------


@pytest.mark.parametrize(
    ("fields", "argument"),
    [
        ({"command": ()}, "command"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"master_port": 70000}, "master_port"),
    ],
)
def test_launch_config_rejects_bad_fields(fields: dict[str, object], argument: str) -> None:
    defaults: dict[str, object] = {"command": ("python",), "nproc_per_node": 2}
    with pytest.raises(ValueError, match=f"LaunchConfig: argument '{argument}' expected"):
        LaunchConfig(**{**defaults, **fields})


@pytest.mark.parametrize(
    ("fields", "argument"), [({"timeout": 0.0}, "timeout"), ({"kill_grace": -1.0}, "kill_grace")]
)
def test_supervise_options_reject_bad_fields(fields: dict[str, float], argument: str) -> None:
    with pytest.raises(ValueError, match=f"SuperviseOptions: argument '{argument}' expected"):
        SuperviseOptions(**fields)


def outcome(label: str, code: int, stopped: bool = False) -> ProcessOutcome:
    return ProcessOutcome(label, code, stopped, ())


def test_result_exit_codes_and_summaries() -> None:
    failed = LaunchResult(
        (outcome("rank 0", -15, True), outcome("rank 1", 3), outcome("rank 2", -15, True)), first_failure=1
    )
    assert (failed.exit_code, failed.summary()) == (
        3,
        "commlayer run: rank 1 exited with code 3; stopped 2 other ranks",
    )
    killed = LaunchResult((outcome("rank 0", -9), outcome("rank 1", -15, True)), first_failure=0)
    assert killed.exit_code == 137
    assert (
        killed.summary()
        == "commlayer run: rank 0 was killed by SIGKILL (exit code 137); stopped 1 other rank"
    )
    timed_out = LaunchResult(
        (outcome("rank 0", 0), outcome("rank 1", -15, True)), timed_out=True, timeout=2.5
    )
    assert (timed_out.exit_code, timed_out.summary()) == (
        124,
        "commlayer run: timed out after 2.5 s; stopped rank 1 (still running)",
    )
    interrupted = LaunchResult((outcome("rank 0", 0),), signal_received=int(signal.SIGINT))
    assert (interrupted.exit_code, interrupted.summary()) == (
        130,
        "commlayer run: received SIGINT and forwarded it to every process",
    )
    fine = LaunchResult((outcome("rank 0", 0), outcome("rank 1", 0)))
    assert (fine.exit_code, fine.summary()) == (0, None)


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["run", "-n", "0", "x.py"], "expected an integer >= 1, received '0'"),
        (["run", "--master-port", "99999", "x.py"], "expected a TCP port in 1..65535"),
        (["run", "--timeout", "-3", "x.py"], "expected a positive number of seconds"),
        (["run", "-n", "2"], "the following arguments are required: SCRIPT"),
        (["launch"], "invalid choice: 'launch'"),
    ],
)
def test_cli_usage_errors_return_2(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert complaint in capsys.readouterr().err


def test_bench_subcommand_without_the_bench_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_BENCH_MODULE", "commlayer._no_such_bench_cli")
    assert cli.main(["bench", "--sizes", "1K"]) == 2
    assert (
        "commlayer bench: the benchmark suite is unavailable: commlayer._no_such_bench_cli is not part of this installation"
        in capsys.readouterr().err
    )


def test_bench_subcommand_help_comes_from_the_bench_package(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("commlayer.bench.cli", reason="commlayer.bench is not importable here")
    assert cli.main(["bench", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: commlayer bench")


# ---- tier 3: real rank processes ---------------------------------------------------------------


@pytest.mark.multirank
def test_run_sets_rank_variables_and_prefixes_both_streams(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert cli.main(["run", "-n", "3", "--master-port", str(port), SCRIPT, "--lr", "0.1", "positional"]) == 0
    out, err = capsys.readouterr()
    for rank in range(3):
        assert env_line(rank, 3, port, "['--lr', '0.1', 'positional']") in out.splitlines()
        assert f"[rank{rank}] rank {rank} says hello on stderr" in err.splitlines()
    assert "commlayer run:" not in err  # no summary when every rank succeeded


@pytest.mark.multirank
def test_default_master_port_is_shared_and_module_mode_works(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)  # `python -m tests.launch...` resolves from the working directory, as in torchrun
    assert cli.main(["run", "--nproc-per-node", "2", "-m", "tests.launch.launcher_ranks", "extra"]) == 0
    ports = set(re.findall(r"MASTER_PORT=(\d+)", capsys.readouterr().out))
    assert len(ports) == 1 and 1 <= int(ports.pop()) <= 65535


@pytest.mark.multirank
def test_first_failure_stops_the_others_and_returns_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "-n", "4", SCRIPT, "--fail-rank", "2", "--exit-code", "3", "--block"]
    assert cli.main(argv) == 3
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(
            "commlayer run: rank 2 exited with code 3; stopped 3 other ranks; every rank's output is in "
        )
    )


@pytest.mark.multirank
def test_timeout_stops_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "-n", "2", "--timeout", "1", SCRIPT, "--block"]) == 124
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith(
            "commlayer run: timed out after 1 s; stopped rank 0, rank 1 (still running); every rank's output is in "
        )
    )


@pytest.mark.multirank
def test_log_dir_holds_one_unprefixed_log_per_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "-n", "2", "--log-dir", str(tmp_path / "logs"), SCRIPT]) == 0
    capsys.readouterr()
    assert sorted(path.name for path in (tmp_path / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    for rank in range(2):
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        port = re.search(r"MASTER_PORT=(\d+)", log).group(1)
        unprefixed_env = env_line(rank, 2, port, "[]").removeprefix(f"[rank{rank}] ")
        assert sorted(log.splitlines()) == sorted([unprefixed_env, f"rank {rank} says hello on stderr"])


@pytest.mark.multirank
def test_launch_api_reports_every_rank_without_echo(capsys: pytest.CaptureFixture[str]) -> None:
    config = LaunchConfig(
        command=(sys.executable, SCRIPT, "--fail-rank", "1", "--kill-self", "--block"),
        nproc_per_node=3,
        master_port=free_port(),
        options=SuperviseOptions(echo=False, forward_signals=False),
    )
    result = launch(config)
    assert capsys.readouterr() == ("", "")
    assert (result.first_failure, result.exit_code, result.timed_out) == (1, 137, False)
    assert [(item.label, item.exit_code, item.stopped) for item in result.outcomes] == [
        ("rank 0", -signal.SIGTERM, True),
        ("rank 1", -signal.SIGKILL, False),
        ("rank 2", -signal.SIGTERM, True),
    ]
    assert "rank 1 says hello on stderr" in result.outcomes[1].output_tail


def _launcher_process(argv: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    # Never hang the suite if the launcher misbehaves: kill it after a generous limit.
    watchdog = threading.Timer(SUBPROCESS_TIMEOUT, process.kill)
    watchdog.daemon = True
    watchdog.start()
    return process


@pytest.mark.multirank
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signals_are_forwarded_to_every_rank(signum: signal.Signals) -> None:
    launcher = _launcher_process(
        [sys.executable, "-m", "commlayer", "run", "-n", "2", SCRIPT, "--trap-signals"]
    )
    assert launcher.stdout is not None
    ready = 0
    for line in launcher.stdout:
        ready += line.endswith("] ready\n")
        if ready == 2:
            break
    launcher.send_signal(signum)
    out, err = launcher.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert launcher.returncode == 128 + signum
    for rank in range(2):
        assert f"[rank{rank}] rank {rank} got {signum.name}" in out.splitlines()
    assert f"commlayer run: received {signum.name} and forwarded it to every process" in err


@pytest.mark.multirank
def test_sigusr1_is_forwarded_to_every_rank_without_stopping_them() -> None:
    launcher = _launcher_process(
        [sys.executable, "-m", "commlayer", "run", "-n", "2", SCRIPT, "--trap-signals"]
    )
    assert launcher.stdout is not None
    expected = [f"[rank{rank}] rank {rank} got SIGUSR1\n" for rank in range(2)]
    seen: list[str] = []
    for line in launcher.stdout:
        seen.append(line)
        if line.endswith("] ready\n") and sum(line.endswith("] ready\n") for line in seen) == 2:
            launcher.send_signal(signal.SIGUSR1)  # a flight-recorder dump request: the ranks go on
        if all(line in seen for line in expected):
            break
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert all(line in seen for line in expected), seen
    assert launcher.returncode == 128 + signal.SIGTERM, err


@pytest.mark.multirank
def test_console_script_matches_python_dash_m() -> None:
    script = Path(sys.executable).parent / "commlayer"
    if not script.exists():
        pytest.skip("the commlayer console script is not installed next to this interpreter")
    launcher = _launcher_process(
        [str(script), "run", "-n", "2", SCRIPT, "--fail-rank", "1", "--exit-code", "5", "--block"]
    )
    _, err = launcher.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert launcher.returncode == 5
    assert err.splitlines()[-1].startswith("commlayer run: rank 1 exited with code 5; stopped 1 other rank; ")
