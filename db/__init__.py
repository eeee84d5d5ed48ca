"""Tables and queries. Knows SQL, not HTTP."""
