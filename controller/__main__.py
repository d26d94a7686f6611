"""`python -m controller ...` is `tailguard ...`."""

from controller.cli import main

raise SystemExit(main())
