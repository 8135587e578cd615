"""The Python SDK, where users import it from: `from timewheel.client import Client`.

The clients live in timewheel/sdk/client.py; this module keeps the import path.
"""

from timewheel.sdk.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
