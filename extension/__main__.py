"""``python -m extension``: the same command line as the ``inplace-extension`` console script."""

from extension.cli import main

raise SystemExit(main())
