"""Event sources and generators carrying event time and arrival time."""
