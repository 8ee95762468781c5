"""Accelerate's ``accelerate.utils`` names. Filled in as modules land."""
