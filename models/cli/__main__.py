"""``python -m pagedstate.models.cli``: the ``pagedstate`` command."""

from pagedstate.models.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
