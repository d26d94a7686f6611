"""The serving lab: experiments and harnesses run on the serving tier (simulator fidelity, calibration, the dataset
generator, the real-vLLM recording and the transfer experiment on it, the surge scenario, the demo, load replay,
the Prometheus stack they start). It may import the tier (serving/tier/), never the reverse."""
