"""Moving due runs into ready streams: the tick, shard leases, dispatch rates, the scheduler
daemon."""
