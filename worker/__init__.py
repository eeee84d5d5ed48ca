"""The node daemon, its launcher, and the training code it runs.

Importing this package must stay cheap: the daemon itself never imports
torch; the launcher and the ranks it spawns do.
"""
