"""The serving tier that ships: engine profiles and calibrations, the engines (simulated replicas, supervised vLLM
processes), the router, rotation and failover, the Kubernetes manifests, and the tier's control API
(`python -m tailguard.serving.tier`, serving/tier/server.py). It imports nothing of the lab (serving/lab/)."""
