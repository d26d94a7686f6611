"""The serving lab, a client of the controller: `tailguard.serving.tier` is the serving tier that ships (engine
profiles, the simulated and real vLLM engines, router, supervisor, rotation, manifests), `tailguard.serving.lab` the
experiments and harnesses on it (simulator fidelity, calibration, dataset, recording, the surge scenario, the demo, load
replay). The lab may import the tier, never the reverse; both reach the controller only through its public face, the
`controller` package (pyproject.toml [tool.importlinter])."""
