"""``python -m psgdlab`` is the same as the ``psgdlab`` command."""

from psgdlab.cli import main

raise SystemExit(main())
