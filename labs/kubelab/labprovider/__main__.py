"""``python -m kubelab.labprovider``: the lab provider's controller process (its ``controller`` module)."""

from __future__ import annotations

import sys

from kubelab.labprovider.controller import main

sys.exit(main())
