"""Presentation: figures and tables, each a function of a recorded DataFrame."""
