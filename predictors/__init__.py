"""The learned SLA-violation model (features, training, evaluation)."""
