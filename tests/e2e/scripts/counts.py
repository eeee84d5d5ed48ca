"""A torchrun-style script that counts its steps as training would step:
each step is an all-reduce across the ranks, and the running total of the
step numbers is reported, so a step done twice or skipped across a stop
shows in the last figure (``total`` = steps * (steps + 1) / 2 when none is).

``--asks``: it asks ddpo whether to stop every step, and when told saves
where it is and exits. Without it, it never asks: it saves at the end of
every ``--steps-per-epoch`` steps and is stopped by signal."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist

import ddpo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--asks", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    state_file = ddpo.checkpoint_dir() / "state.json"
    step, total = 0, 0
    if ddpo.resume_epoch() is not None:
        saved = json.loads(state_file.read_text())
        step, total = saved["step"], saved["total"]
    print(f"resumed at step {step}", flush=True)

    def save() -> None:
        if ddpo.is_rank_zero():
            state_file.write_text(json.dumps({"step": step, "total": total}))

    per_epoch = args.steps_per_epoch
    while step < args.steps:
        step += 1
        number = torch.tensor([float(step)])
        dist.all_reduce(number)  # every rank's step: they are in step
        total += int(number.item()) // dist.get_world_size()
        time.sleep(args.step_seconds)  # the work of a step
        epoch = (step - 1) // per_epoch + 1
        ddpo.report(
            step=step,
            total=total,
            epoch=epoch,
            batch=step - (epoch - 1) * per_epoch,
            batches_per_epoch=per_epoch,
            epochs=-(-args.steps // per_epoch),
        )
        if args.asks and ddpo.should_stop():
            save()
            ddpo.save_checkpoint(epoch=epoch, step=step)
            print(f"stopped after step {step}", flush=True)
            dist.destroy_process_group()
            sys.exit(0)
        if not args.asks and step % per_epoch == 0:
            save()
            ddpo.save_checkpoint(epoch=step // per_epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
