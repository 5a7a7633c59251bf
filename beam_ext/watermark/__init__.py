"""Watermarks without punctuations: the trAcker tracking service."""
