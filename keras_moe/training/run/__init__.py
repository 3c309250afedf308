"""The training loop of one run: its data, model, optimizer, callbacks and closing summary."""
