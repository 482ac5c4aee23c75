"""``python -m syncopate``: the ``syncopate`` command (see :mod:`syncopate.cli`)."""

import sys

from .cli import main

sys.exit(main())
