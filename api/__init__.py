"""The orchestrator's REST server, plus the wire schemas and state machine
that workers import too (this package's __init__ imports nothing heavy)."""
