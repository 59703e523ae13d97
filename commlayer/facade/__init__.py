"""The implementation behind ``commlayer.dist``: validation, group resolution, dispatch to a backend.

Users import :mod:`commlayer.dist`; the modules here are its parts, one concept each.
"""
