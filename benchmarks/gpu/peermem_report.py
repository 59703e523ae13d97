"""The tables of RESULTS.md's peermem section, from the data file benchmarks/gpu/peermem.sh's runs made.

    python benchmarks/gpu/peermem_report.py benchmarks/data/gpu_collectives/4xh200.json

Every figure is a ratio against a reference timed in the same run (NCCL through torch.distributed
on the same communicator, torch's symmetric-memory two-shot), eager / CUDA graph.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SIZES = {16: "16 B", 4096: "4 KiB", 65536: "64 KiB", 262144: "256 KiB", 1 << 20: "1 MiB", 4 << 20: "4 MiB"}
SIZES.update({16 << 20: "16 MiB", 64 << 20: "64 MiB", 256 << 20: "256 MiB"})


def _rows(collectives: dict) -> dict:
    return {(r["method"], r["bytes"]): r for r in collectives["rows"] if "eager_us" in r}


def _pair(cell: dict) -> str:
    return f"{cell['eager_us']:.1f} / {cell['graph_us']:.1f}"


def _ratio(rows: dict, method: str, reference: str | tuple[str, ...], size: int) -> str:
    references = (reference,) if isinstance(reference, str) else reference
    parts = []
    for key in ("eager_us", "graph_us"):
        best = min(rows[(name, size)][key] for name in references)
        parts.append(f"{rows[(method, size)][key] / best:.2f}")
    return " / ".join(parts)


def all_reduce_table(data: dict) -> list[str]:
    out = ["| GPUs | bytes | NCCL | torch two-shot | default | default / faster of the two | backend alone |"]
    out.append("|---|---|---|---|---|---|---|")
    for world, collectives in data["collectives"].items():
        rows = _rows(collectives)
        for size, name in SIZES.items():
            cells = [_pair(rows[(m, size)]) for m in ("nccl", "symm_two_shot", "default")]
            ratio = _ratio(rows, "default", ("nccl", "symm_two_shot"), size)
            out.append(
                f"| {world} | {name} | {' | '.join(cells)} | {ratio} | {_pair(rows[('direct', size)])} |"
            )
    return out


def other_ops_table(data: dict) -> list[str]:
    out = ["| GPUs | bytes | all_gather / NCCL | reduce_scatter / NCCL | all_to_all_single / NCCL |"]
    out.append("|---|---|---|---|---|")
    for world, collectives in data["collectives"].items():
        rows = _rows(collectives)
        for size, name in SIZES.items():
            cells = [_ratio(rows, f"{op}_default", f"{op}_nccl", size) for op in ("ag", "rs", "a2a")]
            out.append(f"| {world} | {name} | {' | '.join(cells)} |")
    return out


def passed_table(data: dict) -> list[str]:
    pairs = (
        ("ar_passed", "nccl"),
        ("ag_passed", "ag_nccl"),
        ("rs_passed", "rs_nccl"),
        ("bc_default", "bc_nccl"),
    )
    out = ["| GPUs | bytes | all_reduce | all_gather_into_tensor | reduce_scatter_tensor | broadcast |"]
    out.append("|---|---|---|---|---|---|")
    for world, collectives in data["collectives"].items():
        rows = _rows(collectives)
        if ("ar_passed", 16) not in rows:  # a run without the forced-to-NCCL rows
            continue
        for size, name in SIZES.items():
            cells = []
            for ours, raw in pairs:
                eager = rows[(ours, size)]["eager_us"] - rows[(raw, size)]["eager_us"]
                cells.append(
                    f"{eager:+.1f} us / {rows[(ours, size)]['graph_us'] / rows[(raw, size)]['graph_us']:.3f}"
                )
            out.append(f"| {world} | {name} | {' | '.join(cells)} |")
    return out


def tp_table(data: dict) -> list[str]:
    out = [
        "| GPUs | hidden (layers) | batch | NCCL step, graph us | fused / NCCL | unfused / NCCL | bitwise equal on ranks |"
    ]
    out.append("|---|---|---|---|---|---|---|")
    for world, report in data["tp_decode"].items():
        cells = {(r["hidden"], r["batch"], r["method"]): r for r in report["rows"]}
        for hidden, batch, _ in sorted({(h, b, 0) for h, b, _ in cells}):
            nccl, fused, unfused = (cells[(hidden, batch, m)] for m in ("nccl", "fused", "unfused"))
            speed = [f"{nccl[k] / r[k]:.2f}" for r in (fused, unfused) for k in ("eager_us", "graph_us")]
            out.append(
                f"| {world} | {hidden} ({fused['layers']}) | {batch} | {nccl['graph_us']:.0f} | "
                f"{speed[0]} / {speed[1]} | {speed[2]} / {speed[3]} | {fused['bitwise_equal_on_ranks']} |"
            )
    return out


def grid_table(data: dict) -> list[str]:
    """peermem_profile.py's sweeps: each kernel at its grid and at the best one, graph us per call."""
    out = [
        "| GPUs | op | bytes | reference (graph us) | kernel's grid: us | best grid: us | kernel / reference |"
    ]
    out.append("|---|---|---|---|---|---|---|")
    for world, report in data.get("profile", {}).items():
        for row in report["rows"]:
            references = {name: row[name] for name in ("nccl", "symm_two_shot") if name in row}
            reference = min(references, key=references.__getitem__)
            grids = {int(key[5:]): us for key, us in row.items() if key.startswith("grid_")}
            best, routed = min(grids, key=grids.__getitem__), row["routed_grid"]
            kernel = grids.get(routed, grids[best])  # a grid outside the sweep: the best one's time
            shown = f"{kernel:.1f}" if routed in grids else "not swept"
            out.append(
                f"| {world} | {row['op']} | {SIZES.get(row['bytes'], row['bytes'])} | "
                f"{reference.replace('symm_', 'torch ')} {references[reference]:.1f} | {routed}: {shown} | "
                f"{best}: {grids[best]:.1f} | {kernel / references[reference]:.2f} |"
            )
    return out


def push_table(data: dict) -> list[str]:
    """all_to_all_single's chunks pulled after the barrier or pushed before it, graph us per call."""
    out = [
        "| GPUs | bytes | NCCL | pulled | pushed up to 256 KiB | up to 1 MiB | up to a slot | pushed / NCCL |"
    ]
    out.append("|---|---|---|---|---|---|---|---|")
    for world, report in data.get("profile", {}).items():
        for row in report["rows"]:
            if "pull" not in row:
                continue
            times = [row[key] for key in ("pull", "push_256KiB", "push_1MiB", "push_slot")]
            out.append(
                f"| {world} | {SIZES.get(row['bytes'], row['bytes'])} | {row['nccl']:.1f} | "
                + " | ".join(f"{us:.1f}" for us in times)
                + f" | {min(times[1:]) / row['nccl']:.2f} |"
            )
    return out


def zero_table(data: dict) -> list[str]:
    """ZeRO stages on the default backend against NCCL, one table row per stage and run."""
    out = ["| run | stage | default tok/s | nccl tok/s | default / nccl | stage / stage 1: default, nccl | "]
    out[0] += "communication alone ms: default, nccl | overlapped ms: default, nccl |"
    out.append("|---|---|---|---|---|---|---|---|")
    for run, rows in data.get("zero", {}).items():
        modes = {row["mode"]: row for row in rows}
        firsts = modes["cl1_default"]["tokens_per_s"], modes["cl1"]["tokens_per_s"]
        for stage in (1, 2, 3):
            ours, nccl = modes[f"cl{stage}_default"], modes[f"cl{stage}"]
            ratio = ours["tokens_per_s"] / nccl["tokens_per_s"]
            profiles = ours["profile"], nccl["profile"]
            out.append(
                f"| {run} | {stage} | {ours['tokens_per_s']:,} | {nccl['tokens_per_s']:,} | {ratio:.2f} | "
                f"{ours['tokens_per_s'] / firsts[0]:.2f}, {nccl['tokens_per_s'] / firsts[1]:.2f} | "
                f"{profiles[0]['comm_alone_ms']}, {profiles[1]['comm_alone_ms']} | "
                f"{profiles[0]['comm_overlapped_ms']}, {profiles[1]['comm_overlapped_ms']} |"
            )
    return out


def zero_streams_table(data: dict) -> list[str]:
    """ZeRO on 2 GPUs with peermem's async calls on the group's stream or on the caller's."""
    out = [
        "| stage | backend | async calls on | tok/s | step ms | communication alone ms | overlapped ms | idle ms |"
    ]
    out.append("|---|---|---|---|---|---|---|---|")
    for row in data.get("zero_streams_2gpu", {}).get("rows", []):
        profile = row["profile"]
        backend = "default" if row["mode"].endswith("_default") else "nccl"
        out.append(
            f"| {row['mode'][2]} | {backend} | {row['async_calls_on']} | {row['tokens_per_s']:,} | "
            f"{row['step_ms']} | {profile['comm_alone_ms']} | {profile['comm_overlapped_ms']} | {profile['idle_ms']} |"
        )
    return out


def async_streams_table(data: dict) -> list[str]:
    """Training on 2 GPUs with peermem's large async calls on the caller's stream or the group's."""
    out = ["| workload | async calls on | tok/s | step ms | peak GiB | loss |", "|---|---|---|---|---|---|"]
    for row in data.get("async_streams_2gpu", {}).get("rows", []):
        out.append(
            f"| {row['workload']} | {row['async_calls_on']} | {row['tokens_per_s']:,} | {row['step_ms']} | "
            f"{row['peak_GiB']} | {row['loss']} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("data", type=Path)
    data = json.loads(parser.parse_args().data.read_text())
    for title, table in (
        ("all_reduce, us eager / graph", all_reduce_table),
        ("other ops, time over NCCL's, eager / graph", other_ops_table),
        ("calls passed to NCCL: eager difference / graph ratio against raw NCCL", passed_table),
        ("TP decode, tokens/s over NCCL, eager / graph", tp_table),
        ("grid sweeps (peermem_profile.py), CUDA graph", grid_table),
        ("all_to_all_single pulled or pushed (peermem_profile.py), CUDA graph", push_table),
        ("ZeRO, 4 GPUs, the anchor's 369M model", zero_table),
        ("ZeRO, 2 GPUs: async calls on the group's stream or the caller's", zero_streams_table),
        ("training on 2 GPUs by where large async calls run", async_streams_table),
    ):
        print(f"\n{title}\n")
        print("\n".join(table(data)))
    print("\nMoE (4 GPUs):", json.dumps(data["moe"]))
    if "moe_profile" in data:
        print("MoE profiled step (default backend):", json.dumps(data["moe_profile"]["profile"]))
    print("conformance:", json.dumps(data["conformance"], indent=1))
    print(
        "checks:", {world: (c["checks_passed"], c["check_failures"]) for world, c in data["checks"].items()}
    )


if __name__ == "__main__":
    main()
