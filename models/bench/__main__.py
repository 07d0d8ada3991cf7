"""``python -m pagedstate.models.bench`` (``make bench``): the store benchmark
(:mod:`pagedstate.models.bench.store`)."""

import sys

from pagedstate.models.bench.store import main

if __name__ == "__main__":
    sys.exit(main())
