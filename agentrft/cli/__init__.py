"""The top floor: `agentrft ...` argument parsing and printing, nothing else. Each module adds
one family of subcommands and calls the API of the package it is named for; nothing under
agentrft/ imports agentrft.cli."""

from agentrft.cli.main import main

__all__ = ["main"]
