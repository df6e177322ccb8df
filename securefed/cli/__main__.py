"""``python -m securefed.cli``: the same entry point as the ``securefed`` command."""

from securefed.cli.root import main

if __name__ == "__main__":
    main()
