"""Compile a gin job's train step for a TPU slice on any host: `keras-moe-compile`."""
