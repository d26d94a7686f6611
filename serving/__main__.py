"""`python -m serving ...` is `tailguard ...` (the controller's commands and the lab's `demo` and `load`)."""

from serving.cli import main

raise SystemExit(main())
