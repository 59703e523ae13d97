"""The torch bridge, the top of the facade: commlayer groups as real torch ProcessGroups (DDP,
FSDP2, DTensor), torch.distributed's own names, what torch.compile traces, and the ``commlayer``
torch backend that torch registers at ``import torch`` (:mod:`.groups.autoload`, kept import-light)."""
