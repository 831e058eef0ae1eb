"""The ``autotune`` command line. The CLI owns the terminal; library code only logs."""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console
from rich.markup import escape

from autotune import __version__
from autotune.cli.daemon import add_daemon_commands
from autotune.cli.export import add_export_command
from autotune.cli.gpu import add_gpu_command
from autotune.cli.output import OutputPathError, check_output
from autotune.cli.study import add_study_command
from autotune.cli.train import add_train_command
from autotune.cli.train_config import explicit_flags
from autotune.cli.wrap import add_wrap_command

logger = logging.getLogger("autotune")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Tune CPU actors and GPU trainer slices of RL training for steps per joule.",
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    add_train_command(sub)
    add_gpu_command(sub)
    add_daemon_commands(sub)
    add_wrap_command(sub)
    add_study_command(sub)
    add_export_command(sub)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; for ``train``, ``explicit`` holds the flags given on the command line
    (they override a ``--config`` file: ``autotune.cli.train_config.train_config``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        train = parser._subparsers._group_actions[0].choices["train"]
        args.explicit = explicit_flags(train, argv)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:  # before the command's work, not at its end with the work done
        storage = getattr(args, "storage", None)
        check_output(getattr(args, "json", None), "--json", storage)
        check_output(getattr(args, "progress", None), "--progress", storage)
        return int(args.func(args))
    except OutputPathError as exc:  # at the start, or a write at the end that failed after all
        Console(stderr=True, emoji=False).print(f"[red]error:[/red] {escape(str(exc))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
