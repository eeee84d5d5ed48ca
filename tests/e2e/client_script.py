"""A user's script driving ddpo through ``ddpo.Client`` (``sync``) or
``ddpo.AsyncClient`` (``async``), as tests/e2e/test_client.py runs it: it
submits a job, follows its logs to the end (the test restarts the server
meanwhile), waits, downloads and loads the model, then meets a failing job
and a bad spec. It prints one JSON object of what it saw."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import torch

import ddpo

JOB = {"name": "client", "epochs": 1, "max_steps_per_epoch": 300}


def loaded(path: Path) -> list[str]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    return sorted(state["model"])


def run_sync(out: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with ddpo.Client(say=lambda m: print(m, file=sys.stderr, flush=True)) as client:
        job = client.submit(JOB, num_machines=1, num_processes=1)
        seen["job"] = job.id
        seen["lines"] = [[line.id, line.text] for line in client.logs(job, follow=True)]
        seen["status"] = str(client.wait(job, timeout_s=600).status)
        seen["listed"] = job.id in [j.id for j in client.list(page_size=2)]
        seen["model_keys"] = loaded(client.download_model(job, out / "sync.pt"))
        try:
            client.wait(client.submit(trainer="crash"), timeout_s=300)
        except ddpo.JobFailed as failed:
            seen["failed"] = [str(failed.reason), str(failed), failed.job.error.traceback_tail]
        try:
            client.submit(num_machines=0)
        except ddpo.Invalid as bad:
            seen["invalid"] = bad.fields
    return seen


async def run_async(out: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with ddpo.AsyncClient(say=lambda m: print(m, file=sys.stderr, flush=True)) as client:
        job = await client.submit(JOB, num_machines=1, num_processes=1)
        seen["job"] = job.id
        seen["lines"] = [[line.id, line.text] async for line in client.logs(job, follow=True)]
        seen["status"] = str((await client.wait(job, timeout_s=600)).status)
        seen["listed"] = job.id in [j.id async for j in client.list(page_size=2)]
        seen["model_keys"] = loaded(await client.download_model(job, out / "async.pt"))
        try:
            await client.wait(await client.submit(trainer="crash"), timeout_s=300)
        except ddpo.JobFailed as failed:
            seen["failed"] = [str(failed.reason), str(failed), failed.job.error.traceback_tail]
        try:
            await client.submit(num_machines=0)
        except ddpo.Invalid as bad:
            seen["invalid"] = bad.fields
    return seen


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    result = run_sync(out) if mode == "sync" else asyncio.run(run_async(out))
    print(json.dumps(result))
