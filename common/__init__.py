"""The lowest layer: small helpers every other package may use (seeds, JSON files, profiles, delays, choices).

Nothing here imports from another project package, so any layer can depend on it.
"""
