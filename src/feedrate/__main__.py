"""``python -m feedrate``: the same as the ``feedrate`` command."""

from feedrate.cli import main

if __name__ == "__main__":
    main()
