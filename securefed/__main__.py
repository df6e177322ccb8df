"""``python -m securefed``: the ``securefed`` command, for an environment whose scripts
folder is not on ``PATH``."""

from securefed.cli import main

if __name__ == "__main__":
    main()
