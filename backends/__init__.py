"""The built-in backends, installed as ``commlayer.backends``.

Each backend is one module implementing :class:`commlayer.contract.backend.Backend`; they register through
the ``commlayer.backends`` entry points in pyproject.toml, exactly as a third-party plugin would.
"""
