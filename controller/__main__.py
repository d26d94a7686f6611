"""`python -m tailguard.controller ...` is `tailguard ...`."""

from tailguard.controller.cli import main

raise SystemExit(main())
