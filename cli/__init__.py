"""The ``ddpo`` command line: talks to the server over HTTP like any user."""
