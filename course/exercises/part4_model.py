"""Checks of lessons 4.3 (the model) and 4.4 (training and sampling)."""
