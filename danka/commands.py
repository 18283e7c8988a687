"""The table of ``danka`` subcommands. ``danka.cli`` builds the parser from it; the user
tools (danka.tools.commands) add theirs with ``@command`` without importing the CLI."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from danka.registry import Registry


@dataclass(frozen=True)
class Command:
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]  # declares the options
    run: Callable  # run(args) -> exit code
    computes: bool = False  # runs a model with torch: OpenMP's wait chosen first (cli)


COMMANDS: Registry[None] = Registry("subcommand")


def command(
    name: str,
    help: str,
    add_args: Callable[[argparse.ArgumentParser], None],
    computes: bool = False,
):
    """Register a subcommand: ``add_args(parser)`` declares its options, the decorated
    ``run(args) -> int`` runs it; ``computes``: it runs a model (models/openmp_wait)."""

    def deco(run: Callable) -> Callable:
        COMMANDS.add(name, Command(help, add_args, run, computes))
        return run

    return deco
