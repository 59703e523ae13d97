"""The foundation every other layer stands on: settings, value types, errors, Work handles, the
flight recorder's ring, liveness facts, the rendezvous environment and job identity.

Nothing here knows a process group or a backend; it imports only the standard library, torch and
itself. Users meet :mod:`.errors`, :mod:`.types` and :mod:`.work` (also re-exported by
``commlayer`` and ``commlayer.dist``).
"""
