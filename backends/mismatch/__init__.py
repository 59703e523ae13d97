"""The default mismatch check that a backend plugs in: every rank's collective signature compared
before the collective runs, so a mismatched call raises on every rank instead of hanging or
returning wrong data.
"""
