"""``python -m pagedcy``: see :mod:`pagedcy.tools.cli`."""
import sys

from pagedcy.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
