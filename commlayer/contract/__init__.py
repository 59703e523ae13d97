"""What a backend is: the contract every backend implements (:mod:`.backend`), what it may build on
(:mod:`.fallbacks`, the window contract and its two-sided emulation), and how backends are
registered (:mod:`.registry`) and chosen (:mod:`.selection`).

It stands on :mod:`commlayer.core` only; the backends (``commlayer.backends``) stand on it, and the
facade above them reaches a backend only through this contract.
"""
