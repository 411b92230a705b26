"""`vl serve`: an OpenAI-compatible HTTP server over `vl.Engine` (docs/server.md), and its client (client.py:
`RemoteEngine`, the Engine's chat interface over any such server)."""
