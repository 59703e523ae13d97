"""`commlayer bench` on one host and across two namespace hosts, unshaped and shaped, in one run.

    sudo .venv/bin/python benchmarks/cpu/multihost.py [--out DIR] [--max-bytes 16M] [--configs one-host,two-hosts]

Configurations (4 ranks each, the same sweep, measured back to back so they share the machine's load):

* ``one host``: ``commlayer bench -n 4`` inside one namespace host (loopback between ranks);
* ``2 hosts x 2``: ``commlayer run --hostfile`` over sshd, the hosts joined by veth + bridge;
* ``2 hosts x 2, tbf RATE``: the same with every host's link limited by ``tc tbf``;
* ``2 hosts x 2, netem DELAY``: only where the kernel has sch_netem (the reason is printed otherwise).

Each writes ``<out>/<name>.json`` (commlayer bench's records); a Markdown table of time per op
for every configuration goes to stdout, ready for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from commlayer.testing.cluster import ClusterOptions, LinkShape, netem_unavailable_reason, network_cluster
from commlayer.testing.cluster_ssh import cluster_sshd

REPO = Path(__file__).resolve().parents[2]
COMMLAYER = str(Path(sys.executable).with_name("commlayer"))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sweep = [
        "--backends",
        args.backends,
        "--ops",
        args.ops,
        "-b",
        "8",
        "-e",
        args.max_bytes,
        "-f",
        "4",
        "--iters",
        "10",
    ]
    configs = [
        ("one-host", None, True),
        ("two-hosts", None, False),
        (f"two-hosts-tbf-{args.rate}mbit", LinkShape(rate_mbit=args.rate), False),
    ]
    reason = netem_unavailable_reason()
    if reason is None:
        configs.append(("two-hosts-netem-1ms", LinkShape(delay_ms=1.0), False))
    else:
        print(f"netem configuration skipped: {reason}", file=sys.stderr)
    if args.configs:
        chosen = set(args.configs.split(","))
        configs = [config for config in configs if config[0] in chosen]
    results = {name: _measure(name, link, one_host, sweep, args.out) for name, link, one_host in configs}
    print(_table(results))
    return 0


def _measure(name: str, link: LinkShape | None, one_host: bool, sweep: list[str], out: Path) -> list[dict]:
    target = out / f"{name}.json"
    with (
        network_cluster(ClusterOptions(hosts=2, link=link)) as cluster,
        cluster_sshd(cluster) as access,
        tempfile.TemporaryDirectory() as job,
    ):
        bench = [*sweep, "--json", str(target)]
        if one_host:
            argv = [COMMLAYER, "bench", "-n", "4", *bench]
        else:
            hostfile = Path(job) / "hostfile"
            hostfile.write_text(
                "".join(f"{host.address} slots=2\n" for host in cluster.hosts), encoding="ascii"
            )
            run = [COMMLAYER, "run", "--hostfile", str(hostfile), "--ssh", " ".join(access.ssh)]
            argv = [*run, "-m", "commlayer", "bench", *bench]
        print(f"== {name}: {link.describe() if link else 'unshaped'}", file=sys.stderr, flush=True)
        subprocess.run(cluster.hosts[0].command(argv, cwd=job), check=True, timeout=1800)
    document = json.loads(target.read_text(encoding="utf-8"))
    return document["records"] if isinstance(document, dict) else document


def _table(results: dict[str, list[dict]]) -> str:
    names = list(results)
    rows = {}
    for name, records in results.items():
        for record in records:
            rows.setdefault((record["backend"], record["op"], record["bytes"]), {})[name] = record["time_us"]
    header = "| backend | op | bytes | " + " | ".join(f"{name} (us)" for name in names) + " |"
    lines = [header, "|" + "---|" * (3 + len(names))]
    for (backend, op, size), times in sorted(rows.items()):
        cells = " | ".join(f"{times[name]:.1f}" if name in times else "-" for name in names)
        lines.append(f"| {backend} | {op} | {size} | {cells} |")
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path("/tmp/multihost_bench"), help="one JSON per configuration"
    )
    parser.add_argument("--backends", default="gloo,shm")
    parser.add_argument("--ops", default="all_reduce,all_gather,pingpong")
    parser.add_argument("--max-bytes", default="16M")
    parser.add_argument("--rate", type=int, default=1000, help="tbf rate of the shaped links, Mbit/s")
    parser.add_argument("--configs", default="", help="comma-separated configuration names (default: all)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
