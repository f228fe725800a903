"""The data path: per-model EDF queues, batching policies, cache, dispatch, pipeline driver."""
