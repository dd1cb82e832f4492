"""Turning results into console tables, HTML and plots. Never measures."""
