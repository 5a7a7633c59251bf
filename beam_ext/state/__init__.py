"""Window state that outgrows memory: spill store, event reservoir, cleanup."""
