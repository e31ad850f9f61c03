"""Integrations: how agent frameworks reach storm (MCP server, harness hooks)."""
