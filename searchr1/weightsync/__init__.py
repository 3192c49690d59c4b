"""Weight publication from the trainer to the rollout engines: bit-level bf16 deltas (codec) over a bucketed
torch.distributed broadcast with digest verification and full-export repair (transport)."""
from searchr1.weightsync.transport import Publisher, Subscriber, SyncError

__all__ = ["Publisher", "Subscriber", "SyncError"]
