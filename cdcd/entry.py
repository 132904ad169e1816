"""The `cdcd` command's entry point: a streaming command catches stop requests before the rest of cdcd loads."""

from __future__ import annotations

import sys

from cdcd import stopping

# Modules structlog uses when they are installed and cdcd never does: its exceptions are rendered as plain text
# (format_exc_info, then the redaction), never by rich. A development environment has rich (pyiceberg needs it) and
# importing it took a quarter of `cdcd run`'s start-up; blocked, the command starts as it does where cdcd's own
# dependencies alone are installed.
UNUSED = ("rich", "better_exceptions")


def block_unused() -> None:
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: `import name` raises ImportError


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in stopping.STREAMING_COMMANDS:
        stopping.catch()
    block_unused()
    from cdcd.cli import main as cli_main  # noqa: PLC0415 - imported after the signal handlers are in place

    return cli_main()
