"""`python -m tailguard.serving.tier --config FILE --state-dir DIR`: the local serving tier (serving/tier/server.py)."""

from tailguard.serving.tier.server import main

raise SystemExit(main())
