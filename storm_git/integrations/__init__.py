"""Integrations: how agent frameworks reach storm (MCP server, harness hooks, the STORM
paper's manager interface)."""
