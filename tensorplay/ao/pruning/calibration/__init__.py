"""Calibration: running a few batches through a model for every one-shot pass that reads them."""
