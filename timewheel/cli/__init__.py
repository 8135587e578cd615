"""The `timewheel` command: `main` parses the arguments and runs one subcommand."""

from timewheel.cli.main import main
from timewheel.cli.parser import build_parser

__all__ = ["build_parser", "main"]
