"""Placing tokens and weights on devices: mesh layouts, sharding annotations,
token exchange between devices, device-local routing groups and the replica context."""
