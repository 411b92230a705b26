"""`vl serve`: an OpenAI-compatible HTTP server over `vl.Engine` (docs/server.md)."""
