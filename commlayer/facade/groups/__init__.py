"""Process groups as the facade sees them: the group and its world, aborted groups, and the queries
torch.distributed answers about them. The lowest part of the facade: no op runs here."""
