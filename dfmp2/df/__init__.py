"""Density fitting: the integral engines, the metric's factor, the B stores and the background I/O thread."""
