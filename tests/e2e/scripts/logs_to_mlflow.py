"""A script that logs to MLflow itself, as a team's script already does:
with ddpo's MLFLOW_TRACKING_URI and MLFLOW_RUN_ID in its environment, its
own mlflow.log_metric lands in the job's run, beside ddpo's reports."""

from __future__ import annotations

import os

import mlflow

import ddpo


def main() -> None:
    assert os.environ.get("MLFLOW_RUN_ID"), "ddpo gives the ranks the job's run"
    for step in range(1, 4):
        ddpo.report(step=step, loss=1.0 / step)
        if os.environ["RANK"] == "0":
            mlflow.log_metric("script_metric", 2.0 * step, step=step)


if __name__ == "__main__":
    main()
