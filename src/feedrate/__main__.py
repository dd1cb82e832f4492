"""``python -m feedrate`` and the ``feedrate`` command: the command line, with a Ctrl-C while
it is still importing its own modules (click, rich) said in one line too, exit status 130."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from feedrate.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("feedrate: interrupted\n")
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
