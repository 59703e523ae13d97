"""commlayer.dist is torch.distributed all the way: namespace, errors, and torch's stack on every backend.

The multi-rank tests train DDP, FSDP2 and a tensor-parallel model (plus a DCP round trip, a
fullgraph-compiled function and torch's semantics checks) in one world per backend, and compare
the parameters mpi and ccl reach against gloo's (same seeds, same data) within 1e-6.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.errors import CommError, CommTimeoutError, InvalidArgumentError, NotInitializedError
from commlayer.core.work import CompletedWork, Work, completed_on_stream
from commlayer.facade.torch_bridge.work import FUTURES_ENV, Completer, has_spare_cpu, inline_futures
from commlayer.launch import ProcessSpec, SuperviseOptions, supervise
from commlayer.testing import mpirun_plan, require_mpirun, run_world

# Names of torch.distributed that commlayer.dist deliberately does not provide, with the reason.
NOT_PROVIDED = {
    "log": "torch.distributed's own module logger, not API",
    "logging": "the standard library module torch.distributed imports",
    "sys": "the standard library module torch.distributed imports",
    "timedelta": "datetime.timedelta, imported by torch.distributed",
    "torch": "the torch package, imported by torch.distributed",
    "traceback": "the standard library module torch.distributed imports",
    "typing": "the standard library module torch.distributed imports",
}
TOLERANCE = 1e-6


def test_every_public_torch_distributed_name_exists() -> None:
    torch_names = {name for name in dir(torch_dist) if not name.startswith("_")}
    missing = sorted(name for name in torch_names - NOT_PROVIDED.keys() if not hasattr(dist, name))
    assert missing == [], f"commlayer.dist lacks torch.distributed names: {missing}"
    stale = sorted(name for name in NOT_PROVIDED if hasattr(dist, name) or name not in torch_names)
    assert stale == [], f"listed as not provided, but provided or no longer in torch: {stale}"


def test_torch_own_objects_are_torch_objects() -> None:
    for name in (
        "TCPStore",
        "FileStore",
        "HashStore",
        "PrefixStore",
        "Store",
        "Backend",
        "DebugLevel",
        "AllreduceOptions",
        "DeviceMesh",
        "GradBucket",
        "Reducer",
        "DistBackendError",
    ):
        assert getattr(dist, name) is getattr(torch_dist, name), name
    assert dist.device_mesh is torch_dist.device_mesh and dist.distributed_c10d is torch_dist.distributed_c10d


def test_errors_are_caught_by_torch_except_clauses() -> None:
    assert issubclass(CommError, torch_dist.DistError) and issubclass(CommError, RuntimeError)
    assert issubclass(CommTimeoutError, torch_dist.DistBackendError) and issubclass(
        CommTimeoutError, TimeoutError
    )
    assert issubclass(NotInitializedError, ValueError) and issubclass(InvalidArgumentError, ValueError)
    with pytest.raises(torch_dist.DistError):
        dist.all_reduce(torch.ones(1))
    with pytest.raises(ValueError, match="not initialized"):
        dist.get_rank()


def test_availability_and_complex_support_follow_commlayer_backends() -> None:
    assert dist.is_gloo_available() and dist.is_backend_available("gloo")
    assert not dist.is_backend_available("no-such-backend")
    assert dist.supports_complex(dist.ReduceOp.SUM) and not dist.supports_complex(dist.ReduceOp.MAX)
    assert dist.supports_complex(torch_dist.ReduceOp.AVG)
    assert dist.get_default_backend_for_device("cpu") == "shm"
    assert dist.get_default_backend_for_device("cuda") == "peermem"


def test_torch_debug_level_api_turns_on_commlayer_debug_mode() -> None:
    from commlayer.facade.calls.debug_check import debug_mode

    assert dist.get_debug_level is torch_dist.get_debug_level and not debug_mode({})
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        assert debug_mode({}), "set_debug_level(DETAIL) did not enable the cross-rank checks"
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)


def test_group_handle_answers_process_group_methods(world_of_one: None) -> None:
    world = dist.group.WORLD
    assert (world.rank(), world.size(), world.name(), str(world.name)) == (0, 1, "gloo", "world")
    assert world.group_name == "world" and world.torch_group is torch_dist.group.WORLD
    t = torch.tensor([3.0])
    world.allreduce([t]).wait()  # any torch ProcessGroup method, through the torch group
    assert t.item() == 3.0
    with pytest.raises(AttributeError, match="no attribute 'allreduse'"):
        world.allreduse  # noqa: B018 - typos still fail


class _GateWork(Work):
    """A Work that completes when its gate opens (or fails with ``error``): drives the completer."""

    def __init__(self, error: BaseException | None = None) -> None:
        super().__init__()
        self.gate = threading.Event()
        self._failure = error

    def _test(self) -> bool:
        return self.gate.is_set()

    def _block(self, timeout_s: float | None) -> bool:
        return self.gate.wait(timeout_s)

    def _on_complete(self) -> None:
        if self._failure is not None:
            raise self._failure


def test_bridge_futures_complete_in_the_background_in_issue_order() -> None:
    completer = Completer("test")
    first, second, failing = _GateWork(), _GateWork(), _GateWork(CommTimeoutError("late"))
    futures = [
        completer.future_of(work, [torch.tensor([float(i)])]) for i, work in enumerate((first, second))
    ]
    failed = completer.future_of(failing, [])
    assert not any(future.done() for future in (*futures, failed)), "a future completed before its op"
    second.gate.set()
    failing.gate.set()
    assert not futures[1].done() or futures[0].done(), "the second future overtook the first"
    first.gate.set()
    assert [future.wait()[0].item() for future in futures] == [0.0, 1.0]
    with pytest.raises(CommTimeoutError, match="late"):
        failed.wait()
    completer.close()  # returns once the thread has let go of every future
    done = Completer("idle").future_of(CompletedWork(), [torch.ones(1)])
    assert done.done() and torch.equal(done.value()[0], torch.ones(1)), "a finished op waited for a thread"


class _StreamWork(CompletedWork):
    """A Work that says it completes on a stream (as peermem's do) but whose tensors are on the CPU."""

    def stream_event(self) -> object:
        return object()


def test_only_an_op_on_one_gpus_stream_gets_a_future_completed_on_the_stream() -> None:
    assert CompletedWork().stream_event() is None  # every Work but those that finish on a stream
    assert completed_on_stream(CompletedWork(), [torch.ones(1)]) is None
    assert completed_on_stream(_StreamWork(), [torch.ones(1)]) is None  # CPU tensors: no stream
    assert completed_on_stream(_StreamWork(), []) is None
    future = Completer("cpu").future_of(_StreamWork(), [torch.ones(2)])
    assert future.done() and torch.equal(future.value()[0], torch.ones(2))  # the usual path
    assert _StreamWork([torch.ones(3)]).get_future().wait()[0].sum() == 3  # and commlayer's own


def test_bridge_futures_inline_mode_completes_in_the_asking_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    work = _GateWork()
    work.gate.set()
    assert Completer("test", inline=True).future_of(work, []).done()
    monkeypatch.setenv(FUTURES_ENV, "inline")
    assert inline_futures(os.environ)
    monkeypatch.setenv(FUTURES_ENV, "background")
    assert not inline_futures(os.environ)
    monkeypatch.setenv(FUTURES_ENV, "auto")
    assert inline_futures(os.environ) in (True, False)
    monkeypatch.setenv(FUTURES_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"torch bridge: argument '\$COMMLAYER_BRIDGE_FUTURES'.*'sometimes'"):
        inline_futures(os.environ)


@pytest.mark.parametrize(
    ("usable", "host", "local_ranks", "spare"),
    [
        (1, 2, 2, False),  # pinned to one core by mpirun: backward and MPI's spin would take turns
        (2, 2, 2, False),  # two unpinned ranks on two cores: one each
        (2, 2, 1, True),  # one rank, two cores
        (4, 64, 16, True),  # pinned to four cores of its own
        (64, 64, 8, True),  # unpinned, eight cores a rank
    ],
)
def test_futures_go_to_the_background_only_where_a_rank_has_a_spare_cpu(
    usable: int, host: int, local_ranks: int, spare: bool
) -> None:
    assert has_spare_cpu(usable, host, local_ranks) is spare


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch-bridge")
    run_world("tests.facade.torch_bridge_ranks:train", 3, backend="gloo", timeout=300, args=[str(out)])
    return out


@pytest.mark.multirank
@pytest.mark.slow
def test_torch_stack_and_compile_on_gloo(gloo_results: Path) -> None:
    assert sorted(path.name for path in gloo_results.glob("gloo-rank*.pt")) == [
        f"gloo-rank{r}.pt" for r in range(3)
    ]


@pytest.mark.multirank
@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "launcher"),
    [
        pytest.param("mpi", "mpirun", marks=pytest.mark.mpi),
        pytest.param("ccl", "local", marks=pytest.mark.ccl),
        ("shm", "local"),
    ],
)
def test_torch_stack_matches_gloo(gloo_results: Path, backend: str, launcher: str) -> None:
    """DDP, FSDP2, TP (+ DCP, fullgraph compile, semantics) through the bridge reach gloo's parameters."""
    if launcher == "mpirun":
        require_mpirun()
    if not dist.is_backend_available(backend):
        pytest.skip(f"the {backend} backend is not available here")
    args = [str(gloo_results)]
    run_world(
        "tests.facade.torch_bridge_ranks:train", 3, backend=backend, launcher=launcher, timeout=300, args=args
    )
    _assert_same_parameters(gloo_results, backend)


@pytest.mark.multirank
@pytest.mark.mpi
def test_unmodified_torch_ddp_script_runs_on_mpi_under_mpirun() -> None:
    """``mpirun -n 3 python examples/torch_ddp.py``: torch's init_process_group("commlayer") on mpi."""
    require_mpirun()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = {"COMMLAYER_BACKEND": "mpi", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    plan = mpirun_plan(3, {**os.environ, **job})
    script = Path(__file__).resolve().parents[2] / "examples" / "torch_ddp.py"
    options = SuperviseOptions(timeout=180, echo=False, forward_signals=False, kill_grace=1.0, tail_lines=80)
    result = supervise([ProcessSpec("mpirun", (*plan.argv, sys.executable, str(script)), plan.env)], options)
    output = "\n".join(result.outcomes[0].output_tail)
    assert result.exit_code == 0 and not result.timed_out, output
    assert output.count("backend='mpi')): replicas identical after 5 steps") == 3, output


def _assert_same_parameters(directory: Path, backend: str) -> None:
    for rank in range(3):
        reference = torch.load(directory / f"gloo-rank{rank}.pt")
        trained = torch.load(directory / f"{backend}-rank{rank}.pt")
        assert reference.keys() == trained.keys()
        for model, parameters in reference.items():
            for name, expected in parameters.items():
                difference = (trained[model][name] - expected).abs().max().item()
                assert difference <= TOLERANCE, f"{backend} rank {rank} {model}.{name}: off by {difference}"


@pytest.mark.multirank
@pytest.mark.mpi
def test_torch_2d_device_mesh_dtensor_and_hsdp_on_commlayer_match_gloo() -> None:
    """torch's new_group(backend="commlayer") under init_device_mesh("cpu", (2, 2)), 4 ranks on mpi.

    Also: the bridge's futures complete in the background and in issue order, and bad input gets
    the facade's errors (tests.facade.torch_bridge_mesh2d_ranks).
    """
    require_mpirun()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    job = {
        "COMMLAYER_BACKEND": "mpi",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        FUTURES_ENV: "background",
    }
    run_world(
        "tests.facade.torch_bridge_mesh2d_ranks:main",
        4,
        backend=None,
        launcher="mpirun",
        env=job,
        timeout=300,
    )


@pytest.mark.multirank
def test_torch_2d_device_mesh_on_shm_matches_gloo() -> None:
    """torch's new_group on a "commlayer" world over shm (gloo companions: every rank builds)."""
    run_world(
        "tests.facade.torch_bridge_mesh2d_ranks:on_shm",
        4,
        backend=None,
        env={"COMMLAYER_BACKEND": "shm"},
        timeout=300,
    )


def test_bridge_registration_without_torchs_helper_fills_the_same_tables(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.11 and older lack ``_register_pg_in_world``: the bridge fills its tables itself."""
    import torch.distributed.distributed_c10d as c10d

    from commlayer.facade.groups.group import current_world
    from commlayer.facade.torch_bridge import groups as bridge

    world, group = current_world("test"), dist.new_group([0])
    by_torch = bridge._register(group, "commlayer:by_torch", world)
    monkeypatch.delattr(c10d, "_register_pg_in_world")
    by_hand = bridge._register(group, "commlayer:by_hand", world)

    def entry(pg: object, name: str) -> tuple:
        tables = c10d._world
        return (
            tables.pg_names[pg] == name,
            c10d._resolve_process_group(name) is pg,
            tables.pg_map[pg][0],
            tables.pg_backend_config[pg],
            tables.pg_group_ranks[pg],
            tables.pg_to_tag[pg] == f"ptd:{name}",
            pg in tables.tags_to_pg[""] and pg in tables.tags_to_pg[f"ptd:{name}"],
        )

    assert entry(by_hand, "commlayer:by_hand") == entry(by_torch, "commlayer:by_torch")
    assert entry(by_hand, "commlayer:by_hand")[:2] == (True, True)
    for pg in (by_torch, by_hand):
        torch_dist.destroy_process_group(pg)
