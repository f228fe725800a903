"""inferline subsystem."""
