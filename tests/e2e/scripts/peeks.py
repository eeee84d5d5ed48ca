"""A script that looks for the node's secrets, as a hostile package it
imports could: its environment, and the files named on its command line."""

from __future__ import annotations

import os
import sys

import ddpo

if __name__ == "__main__":
    secrets = sorted(name for name in os.environ if name.startswith("DDPO_"))
    print(f"DDPO variables: {', '.join(secrets)}", flush=True)
    print(f"join token seen: {'DDPO_JOIN_TOKEN' in os.environ}", flush=True)
    for path in sys.argv[1:]:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            print(f"{path}: cannot open ({exc.strerror})", flush=True)
        else:
            print(f"{path}: read {len(text)} characters", flush=True)
    ddpo.report(step=1, loss=0.0)
