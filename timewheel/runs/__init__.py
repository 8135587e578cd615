"""Dispatched runs: what executors read, their outcomes, the worker, the webhook executor,
dead letters."""
