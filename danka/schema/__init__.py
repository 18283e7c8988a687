"""The config's typed schema, below everything else: the sections and their help text
(sections.py), dtype names, secret masking, where keys moved, memory units. Loading and
validation (danka/config) read the registries of the layers above; this package reads
none of them, so any layer may import it."""
