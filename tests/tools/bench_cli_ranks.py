"""Rank body for tests/tools/test_bench_cli.py: `commlayer bench` run in place on every rank, as torchrun would."""

from __future__ import annotations

import argparse

from commlayer.bench import cli


def run(json_path: str, *bench_args: str) -> None:
    parser = argparse.ArgumentParser(prog="commlayer bench")
    cli.add_arguments(parser)
    code = cli.main(parser.parse_args([*bench_args, "--json", json_path]))
    assert code == 0, f"commlayer bench returned {code}"
