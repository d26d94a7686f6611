"""Actuators: the thin edges that change the world (serving tier, annotations, notifications)."""
