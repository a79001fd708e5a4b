"""The ``servelab`` command line: the Hydra entry point and its subcommands."""

from servelab.cli.main import main

__all__ = ["main"]
