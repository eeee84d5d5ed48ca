"""What the server does when something happens, without HTTP: each public
function is one database transaction, takes the server's :class:`Core`
(api/core/context.py) and raises the errors of api/core/errors.py, which
api/main.py answers as HTTP statuses.

- ``jobs``: submit and cancel jobs and studies.
- ``nodes``: register, revoke, poll and heartbeat; which node runs what.
- ``clock``: the server's tick: silent nodes, deadlines, retries due.
- ``reports``: a part started, bound its rendezvous, progressed, logged, finished.
- ``artifacts``: checkpoint files: uploads kept, the newest served.
- ``settlement``: what a job becomes after a change (cancel, lose, settle,
  retry or fail); the status changes go through ddpo/lifecycle.py.
- ``placement``: start the queued jobs that fit (the plan is api/scheduling.py's).
- ``lookup``: the rows a command acts on, or the error saying why not.

Every arrow points down the list: nothing below imports what is above it.
"""
