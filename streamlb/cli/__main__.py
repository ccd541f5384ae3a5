"""``python -m streamlb.cli``: the ``streamlb`` command, as ``python -m streamlb``."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
