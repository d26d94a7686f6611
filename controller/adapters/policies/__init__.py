"""Policy sources beside files: TailguardPolicy custom resources (crd.py; its schema: crd_schema.py)."""
