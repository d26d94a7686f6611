"""`python -m tailguard.serving ...` is `tailguard ...` (the controller's commands and the lab's `demo` and `load`)."""

from tailguard.serving.cli import main

raise SystemExit(main())
