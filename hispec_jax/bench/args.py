"""Argument types shared by the `hispec` command and the benchmark tools: comma-separated
lists of numbers. Standard library only (arguments are parsed before JAX is imported)."""

from __future__ import annotations

import argparse


def int_list(text: str) -> tuple[int, ...]:
    """`"3,6"` -> (3, 6); `""` -> (). argparse type: a bad entry is a usage error."""
    try:
        return tuple(int(x) for x in text.split(",")) if text else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def positive_int_list(text: str) -> tuple[int, ...]:
    """`int_list` whose entries are all >= 1 (batch sizes, lengths)."""
    values = int_list(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def float_list(text: str) -> tuple[float, ...]:
    """`"0.6,1"` -> (0.6, 1.0); `""` -> ()."""
    try:
        return tuple(float(x) for x in text.split(",")) if text else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")


class Parser(argparse.ArgumentParser):
    """argparse's parser with a one-line usage error, `PROG: error: MESSAGE (see PROG
    --help)`, and exit status 2 (argparse prints its whole usage block first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
