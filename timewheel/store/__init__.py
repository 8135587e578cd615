"""Redis: the connection, key names, the Lua Function library, pipelines and the stored record."""
