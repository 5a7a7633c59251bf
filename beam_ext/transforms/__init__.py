"""Beam transforms that run on any runner and fastest on SparkRunner."""
