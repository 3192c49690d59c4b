"""Weight publication from the trainer to the rollout engines: bit-level bf16 deltas (codec) over a bucketed
torch.distributed broadcast with digest verification and full-export repair (transport)."""
from searchr1.weightsync.transport import Publication, Publisher, Subscriber, SyncError, replay

__all__ = ["Publication", "Publisher", "Subscriber", "SyncError", "replay"]
