"""``python -m inplace_extension``: the same command line as the ``inplace-extension`` console script."""

from inplace_extension.cli import main

raise SystemExit(main())
