"""`python -m controller ...` is `tailguard ...`."""

from controller.app.cli import main

raise SystemExit(main())
