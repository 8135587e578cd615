"""The HTTP client library: request builders, sync and async clients, their errors."""
