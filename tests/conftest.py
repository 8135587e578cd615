"""The suite's fixtures come from the timewheel.testing plugin: real servers (standalone
redis-server with AOF, a 3-primary Cluster, PostgreSQL), settings with a fresh key prefix
per test, and engines on them. Helpers in timewheel.testing get pytest's assert messages.

The tests are in four folders by what they need: unit/ (no server), lua/ (a real Redis),
integration/ (the API app in process, PostgreSQL), process/ (`timewheel` processes and
servers started, killed and restarted by the test).
"""

import pytest

pytest.register_assert_rewrite("timewheel.testing")

pytest_plugins = ["timewheel.testing.plugin"]
