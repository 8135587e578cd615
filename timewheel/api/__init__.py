"""The HTTP API (Starlette)."""

from timewheel.api.app import create_app

__all__ = ["create_app"]
