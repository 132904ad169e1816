"""The `cdcd` command's entry point: a streaming command catches stop requests before the rest of cdcd loads."""

from __future__ import annotations

import sys

from cdcd import stopping


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in stopping.STREAMING_COMMANDS:
        stopping.catch()
    from cdcd.cli import main as cli_main  # noqa: PLC0415 - imported after the signal handlers are in place

    return cli_main()
