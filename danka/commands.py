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


COMMANDS: Registry[None] = Registry("subcommand")


def command(name: str, help: str, add_args: Callable[[argparse.ArgumentParser], None]):
    """Register a subcommand: ``add_args(parser)`` declares its options, the decorated
    ``run(args) -> int`` runs it."""

    def deco(run: Callable) -> Callable:
        COMMANDS.add(name, Command(help, add_args, run))
        return run

    return deco
