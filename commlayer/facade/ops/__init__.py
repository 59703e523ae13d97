"""The ops of ``torch.distributed``, each built on :mod:`commlayer.facade.calls`: collectives in place, into a
tensor, over tensor lists, rooted, uneven and coalesced; point-to-point; object collectives."""
