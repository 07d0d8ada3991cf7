"""``python -m pagedstate.impl.transfer``: one rank of :func:`spawn_transfer` (its child
process)."""

import sys

from pagedstate.impl.transfer.launch import _main

if __name__ == "__main__":
    sys.exit(_main())
