"""Losses as pure functions of log-prob tensors (no models, no trainers)."""
