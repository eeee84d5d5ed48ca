"""The dashboard in a real headless Chromium, against the real server and
workers: submit through the form, watch the bar and the loss chart fill, see
the accuracy, cancel a job from its page. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from cli.cluster import LocalCluster
from tests.e2e.browser import ARTIFACTS, badge, needs_a_browser, sign_in
from tests.e2e.conftest import Jobs

# CI sets DDPO_REQUIRE_BROWSER: there a missing browser fails, never skips.
pytestmark = needs_a_browser


def test_submit_watch_and_cancel_from_the_browser(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    # The server has tokens: the dashboard asks for one, once.
    page.goto(f"{cluster.url}/ui/jobs")
    page.locator("#token-form").wait_for()
    sign_in(page, cluster, "not-a-token")
    page.get_by_role("heading", name="The saved token was refused").wait_for()
    sign_in(page, cluster, cluster.tokens.user)
    page.locator("#connection", has_text="updated").wait_for()
    assert page.locator("#token-form").count() == 0

    page.goto(f"{cluster.url}/ui/submit")
    page.fill("input[name=name]", "from-the-form")
    page.fill("input[name=batch_size]", "64")
    page.fill("input[name=num_processes]", "2")
    page.fill("input[name=max_steps_per_epoch]", "300")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/ui/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    submitted = jobs.get(job_id)
    assert submitted["name"] == "from-the-form"
    assert submitted["spec"]["topology"]["num_processes"] == 2
    assert submitted["spec"]["batch_size"] == 64

    # Caught mid-run: the bar part-way, the chart with points in it.
    page.wait_for_function(
        """() => {
            const pct = parseFloat(document.getElementById('percent').textContent);
            const chart = document.getElementById('loss-chart');
            return pct > 0 && pct < 100 && chart.data && chart.data[0].x.length >= 2;
        }""",
        timeout=120_000,
    )
    assert badge(page) == "running"
    width = page.eval_on_selector("#progress-bar .bar > span", "s => s.style.width")
    assert 0 < float(width.rstrip("%")) < 100
    assert re.search(r"ETA \d", page.inner_text("#eta"))

    page.wait_for_function(
        "document.querySelector('#status .badge').textContent === 'succeeded'",
        timeout=120_000,
    )
    job = jobs.get(job_id)
    expected = f"{100 * job['result']['test_accuracy']:.2f}%"
    page.wait_for_function(f"document.getElementById('accuracy')?.textContent === '{expected}'")
    points = page.eval_on_selector("#loss-chart", "c => c.data[0].x.length")
    assert points == len(jobs.client.get(f"/jobs/{job_id}/metrics").json()["points"]) >= 30
    page.wait_for_function("document.getElementById('logs').textContent.includes('Test set:')")
    assert page.locator("#machines tbody tr").count() == 1
    page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)

    # The jobs page lists it, filtered by status.
    page.goto(f"{cluster.url}/ui/jobs")
    row = page.locator(f"#jobs tr[data-job='{job_id}']")
    row.wait_for()
    assert "from-the-form" in row.inner_text() and expected in row.inner_text()
    page.select_option("#status-filter", "failed")
    row.wait_for(state="detached")
    page.select_option("#status-filter", "succeeded")
    row.wait_for()
    page.select_option("#status-filter", "")
    page.screenshot(path=str(ARTIFACTS / "dashboard-jobs.png"), full_page=True)

    # A second job, cancelled from its page.
    long_id = jobs.submit(name="to-cancel")  # a whole epoch: far longer than the test
    page.goto(f"{cluster.url}/ui/jobs/{long_id}")
    page.wait_for_function(
        "document.querySelector('#status .badge')?.textContent === 'running'", timeout=60_000
    )
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    page.wait_for_function(
        "document.querySelector('#status .badge').textContent === 'cancelled'", timeout=15_000
    )
    assert jobs.get(long_id)["status"] == "cancelled"
    assert page.is_hidden("#cancel")  # nothing left to cancel
    assert "stopped: the job was cancelled" in page.inner_text("#machines")

    page.goto(f"{cluster.url}/ui/nodes")
    page.locator("#nodes tbody tr").nth(1).wait_for()
    assert sorted(page.locator("#nodes tbody tr td:first-child").all_inner_texts()) == [
        "node-0",
        "node-1",
    ]
    page.screenshot(path=str(ARTIFACTS / "dashboard-nodes.png"), full_page=True)


def test_the_submit_form_offers_trainers_params_scripts_priority_restarts_and_a_deadline(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    page.goto(f"{cluster.url}/ui/submit")
    sign_in(page, cluster, cluster.tokens.user)
    # What the live nodes offer: the example plugin's trainer and the scripts.
    page.locator("select[name=runs] option[value='trainer:charlm']").wait_for(state="attached")
    page.select_option("select[name=runs]", "trainer:charlm")
    page.get_by_text("params: context, embed_dim").wait_for()
    page.fill("textarea[name=params]", '{"hidden": 32, "steps_per_epoch": 5}')
    page.fill("input[name=priority]", "-3")  # below the others': it preempts no test's job
    page.fill("input[name=max_restarts]", "2")
    page.fill("input[name=max_run_seconds]", "600")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/ui/jobs/\d+$"))
    plugin_job = int(page.url.rsplit("/", 1)[1])
    spec = jobs.get(plugin_job)["spec"]
    assert spec["trainer"] == "charlm" and spec["params"] == {"hidden": 32, "steps_per_epoch": 5}
    assert (spec["priority"], spec["max_restarts"], spec["max_run_seconds"]) == (-3, 2, 600)

    page.goto(f"{cluster.url}/ui/submit")
    page.locator("select[name=runs] option[value='script:torchrun_mlp.py']").wait_for(
        state="attached"
    )
    page.select_option("select[name=runs]", "script:torchrun_mlp.py")
    page.fill("input[name=script_args]", "--epochs 1 --steps-per-epoch 5")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/ui/jobs/\d+$"))
    script_job = int(page.url.rsplit("/", 1)[1])
    spec = jobs.get(script_job)["spec"]
    assert spec["script"]["path"] == "torchrun_mlp.py"
    assert spec["script"]["args"] == ["--epochs", "1", "--steps-per-epoch", "5"]

    # A param the trainer does not take: the server's words, naming it.
    page.goto(f"{cluster.url}/ui/submit")
    page.locator("select[name=runs] option[value='trainer:charlm']").wait_for(state="attached")
    page.select_option("select[name=runs]", "trainer:charlm")
    page.fill("textarea[name=params]", '{"hiddn": 32}')
    page.click("button[type=submit]")
    page.locator("#submit-problem", has_text="params").wait_for()
    page.fill("textarea[name=params]", "{not json")
    page.click("button[type=submit]")
    page.locator("#submit-problem", has_text="params: not JSON").wait_for()
    for job_id in (plugin_job, script_job):
        assert jobs.wait_done(job_id)["status"] == "succeeded", jobs.get(job_id)


def test_a_read_token_watches_but_cannot_submit(page: Any, cluster: LocalCluster) -> None:
    assert cluster.tokens is not None
    page.goto(f"{cluster.url}/ui/nodes")
    sign_in(page, cluster, cluster.tokens.read)
    page.locator("#nodes tbody tr").nth(1).wait_for()
    page.goto(f"{cluster.url}/ui/submit")
    page.click("button[type=submit]")
    page.get_by_text("the reader role may not do this").wait_for()
    # Forgetting the token brings the question back.
    page.click("#forget-token")
    page.wait_for_load_state()
    page.goto(f"{cluster.url}/ui/nodes")
    page.locator("#token-form").wait_for()
    assert page.locator("#nodes tbody tr td:first-child").all_inner_texts() == []


def test_the_job_and_study_pages_tell_the_whole_story(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    page.goto(f"{cluster.url}/ui/jobs")
    sign_in(page, cluster, cluster.tokens.user)

    # Two attempts, the first killed by a signal: both shown, with the error.
    retried = jobs.submit(trainer="killed-once", max_restarts=1, name=f"retried-{uuid.uuid4().hex}")
    assert jobs.wait_done(retried)["status"] == "succeeded"
    page.goto(f"{cluster.url}/ui/jobs/{retried}")
    page.locator("#attempts tr[data-attempt='2']").wait_for()
    first = page.inner_text("#attempts tr[data-attempt='1']")
    assert "rank_exited" in first and "SIGKILL" in first, first
    assert "succeeded" in page.inner_text("#attempts tr[data-attempt='2']")
    page.screenshot(path=str(ARTIFACTS / "dashboard-attempts.png"), full_page=True)

    # A deadline: the spec says it, and the machine says why it was stopped.
    late = jobs.submit(max_run_seconds=4)  # a whole epoch takes far longer
    assert jobs.wait_done(late)["error"]["reason"] == "deadline"
    page.goto(f"{cluster.url}/ui/jobs/{late}")
    page.get_by_text("4 s after the first start (max_run_seconds)").wait_for()
    page.locator("#machines td.why", has_text="stopped at the job's deadline").wait_for()
    assert page.is_hidden("#cancel")
    assert "None: the job failed" in page.inner_text("#result")
    page.screenshot(path=str(ARTIFACTS / "dashboard-deadline.png"), full_page=True)

    # A job that does not exist says so.
    page.goto(f"{cluster.url}/ui/jobs/999999")
    page.get_by_role("heading", name="Job 999999 does not exist").wait_for()
    assert "job 999999 not found" in page.inner_text("#not-found")

    # A study: its table, and its speedup beside the ideal line.
    study = jobs.client.post(
        "/studies",
        json={
            "spec": {"max_steps_per_epoch": 20},
            "rows": [
                {"num_processes": 1, "batch_size": 128},
                {"num_processes": 2, "batch_size": 64},
            ],
        },
    ).json()
    page.goto(f"{cluster.url}/ui/studies")
    page.locator(f"#studies a[href='/ui/studies/{study['id']}']").click()
    page.wait_for_function(
        "document.querySelector('#status .badge')?.textContent === 'succeeded'",
        timeout=180_000,
    )
    page.wait_for_function(
        "document.getElementById('speedup-chart').data?.[1]?.x.length === 2", timeout=10_000
    )
    assert page.locator("#study-rows tbody tr").count() == 2
    traces = page.eval_on_selector("#speedup-chart", "c => c.data.map((t) => t.name)")
    assert traces == ["ideal (linear)", "measured"]
    ideal = page.eval_on_selector("#speedup-chart", "c => c.data[0].y")
    assert ideal == [1, 2]
    page.screenshot(path=str(ARTIFACTS / "dashboard-study.png"), full_page=True)


def test_an_installed_trainer_package_is_offered_with_its_schema_and_its_metrics_charted(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    """examples/charlm, pip-installed (the example_site fixture) on both nodes."""
    listed = jobs.client.get("/trainers").raise_for_status().json()
    (charlm,) = [t for t in listed["trainers"] if t["name"] == "charlm"]
    assert charlm["version"] == "0.2.0"
    assert sorted(charlm["nodes"]) == ["node-0", "node-1"]
    schema = charlm["params_schema"]
    assert schema["properties"]["context"]["maximum"] == 64
    assert schema["additionalProperties"] is False

    refused = jobs.client.post("/jobs", json={"trainer": "charlm", "params": {"context": 100}})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["msg"].startswith("params.context: 100 is greater than")

    job_id = jobs.submit(
        machines=2,
        processes=1,
        trainer="charlm",
        epochs=2,
        batch_size=32,
        params={"context": 6, "steps_per_epoch": 40},
    )
    job = jobs.wait_done(job_id, timeout_s=180)
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["test_accuracy"] > 0
    assert job["checkpoint"]["epoch"] == 2

    metrics = jobs.client.get(f"/jobs/{job_id}/metrics").raise_for_status().json()
    assert metrics["names"] == ["loss", "samples_per_sec", "perplexity", "char_accuracy"]
    points = metrics["points"]
    assert len(points) == 8  # every 10 of 40 steps, two epochs
    assert [p["step"] for p in points] == [10, 20, 30, 40, 50, 60, 70, 80]
    for point in points:
        assert 1 < point["metrics"]["perplexity"] < 100
        assert 0 <= point["metrics"]["char_accuracy"] <= 1
    # It learns: the text is less surprising at the end than at the start.
    assert points[-1]["metrics"]["perplexity"] < points[0]["metrics"]["perplexity"]
    assert job["progress"]["metrics"] == points[-1]["metrics"]

    # The job page charts them, one small chart each, with every point.
    assert cluster.tokens is not None
    page.goto(f"{cluster.url}/ui/jobs/{job_id}")
    sign_in(page, cluster, cluster.tokens.user)
    page.wait_for_function(
        "() => document.getElementById('metrics-chart').data?.length === 2", timeout=30_000
    )
    charted = page.eval_on_selector(
        "#metrics-chart", "c => c.data.map(t => [t.name, t.x.length, t.y[t.y.length - 1]])"
    )
    assert charted == [
        ["perplexity", 8, points[-1]["metrics"]["perplexity"]],
        ["char_accuracy", 8, points[-1]["metrics"]["char_accuracy"]],
    ]
    assert page.locator("#metrics-card").is_visible()
    page.screenshot(path=str(ARTIFACTS / "dashboard-plugin-metrics.png"), full_page=True)


def queue_rows(page: Any) -> list[tuple[int, int, str, str]]:
    """(position, job, owner, reason) of each row the queue page shows."""
    rows: list[tuple[int, int, str, str]] = page.eval_on_selector_all(
        "#queue tbody tr[data-job]",
        """rows => rows.map((r) => [Number(r.querySelector('.position').textContent),
            Number(r.dataset.job), r.querySelector('.owner').textContent,
            r.querySelector('.reason').textContent])""",
    )
    return [tuple(row) for row in rows]  # type: ignore[misc]


def api_queue(jobs: Jobs) -> list[tuple[int, int, str, str]]:
    queue = jobs.client.get("/queue").raise_for_status().json()
    return [(q["position"], q["job_id"], q["owner"], q["pending"]["reason"]) for q in queue["data"]]


def shows_the_apis_queue(page: Any, jobs: Jobs, timeout_s: float = 15) -> list[Any]:
    """The page's rows once they match GET /queue (the page polls every 2 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        wanted, shown = api_queue(jobs), queue_rows(page)
        if wanted == shown and wanted:
            return wanted
        if time.monotonic() > deadline:
            raise AssertionError(f"the queue page shows {shown}; GET /queue says {wanted}")
        time.sleep(0.2)


def test_the_queue_page_shows_what_get_queue_says_and_follows_a_priority_change(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    with cluster.client("admin") as admin:
        made = admin.post("/keys", json={"name": f"alice-{uuid.uuid4().hex[:6]}", "role": "user"})
        alice = made.raise_for_status().json()
    # Both single-slot nodes busy for far longer than the test.
    blockers = [jobs.submit(epochs=3, name="blocker") for _ in range(2)]
    for blocker in blockers:
        jobs.wait(blocker, lambda j: j["status"] == "running", 60, "the blocker to run")
    both = jobs.client.post(
        "/jobs",
        json={"name": "alices-2x1", "topology": {"num_machines": 2, "num_processes": 1}},
        headers={"Authorization": f"Bearer {alice['key']}"},
    ).json()
    small = jobs.submit(name="small")

    page.goto(f"{cluster.url}/ui/queue")
    sign_in(page, cluster, cluster.tokens.user)
    shown = shows_the_apis_queue(page, jobs)
    assert [(pos, job, owner) for pos, job, owner, _ in shown] == [
        (1, both["id"], alice["name"]),
        (2, small, "token:user"),
    ]
    assert page.locator(f"#queue tr[data-job='{both['id']}'] .free").inner_text() == (
        "0 free of 2 suitable, 2 live"
    )
    assert page.locator(f"#queue tr[data-job='{both['id']}'] .code").inner_text() == (
        "waiting_for_slots"
    )
    page.screenshot(path=str(ARTIFACTS / "dashboard-queue.png"), full_page=True)

    # Raised above alice's job: first at once, in the API and on the page.
    jobs.client.patch(f"/jobs/{small}", json={"priority": 10}).raise_for_status()
    shown = shows_the_apis_queue(page, jobs)
    assert [job for _, job, _, _ in shown] == [small, both["id"]]
    assert page.locator(f"#queue tr[data-job='{small}'] .priority").inner_text() == "10"

    # The job page names its owner and its place.
    page.goto(f"{cluster.url}/ui/jobs/{both['id']}")
    page.locator("#owner", has_text=alice["name"]).wait_for()
    page.locator("#pending", has_text="#2 in the queue (priority 0)").wait_for()
    # Not the user token's to steer: the page says whose it is, and offers
    # neither a cancel nor a priority.
    page.locator("#whoami", has_text="token:user (user)").wait_for()
    page.wait_for_function("document.getElementById('cancel').disabled")
    assert page.get_attribute("#cancel", "title") == (
        f"job {both['id']} is {alice['name']}'s: only its owner or an admin may cancel it"
    )
    assert page.is_hidden("#priority-form")

    # Its own job: the priority set from its page moves it in the queue.
    page.goto(f"{cluster.url}/ui/jobs/{small}")
    page.locator("#priority-form").wait_for()
    assert page.input_value("#priority") == "10"
    page.fill("#priority", "-5")
    page.click("#priority-form button[type=submit]")
    page.locator("#pending", has_text="#2 in the queue (priority -5)").wait_for()
    assert [job for _, job, _, _ in api_queue(jobs)] == [both["id"], small]
    assert not page.is_disabled("#cancel")


def test_the_compare_view_overlays_two_jobs_loss_curves(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    first = jobs.submit(max_steps_per_epoch=60, lr=0.5, name="lr-0.5")
    second = jobs.submit(max_steps_per_epoch=60, lr=0.05, name="lr-0.05")
    for job_id in (first, second):
        assert jobs.wait_done(job_id)["status"] == "succeeded"
    page.goto(f"{cluster.url}/ui/jobs")
    sign_in(page, cluster, cluster.tokens.read)
    for job_id in (first, second):
        page.locator(f"#jobs input[data-pick='{job_id}']").check()
    page.click("#compare-selected")
    page.wait_for_url(re.compile(r"/ui/compare\?jobs="))
    page.wait_for_function(
        "document.getElementById('compare-chart').data?.length === 2", timeout=15_000
    )
    traces = page.eval_on_selector("#compare-chart", "c => c.data.map((t) => [t.name, t.x, t.y])")
    for (name, steps, losses), job_id in zip(traces, (first, second), strict=True):
        points = jobs.client.get(f"/jobs/{job_id}/metrics").json()["points"]
        assert name.startswith(f"job {job_id} ")
        assert steps == [p["step"] for p in points] and len(steps) >= 5
        assert losses == [p["loss"] for p in points]
    assert traces[0][2] != traces[1][2]  # two curves, not one drawn twice
    assert page.eval_on_selector("#compare-chart", "c => c.layout.yaxis.title.text") == "loss"
    page.screenshot(path=str(ARTIFACTS / "dashboard-compare.png"), full_page=True)

    # Any reported metric: throughput, picked from the menu.
    page.select_option("#metric", "samples_per_sec")
    page.wait_for_function(
        "document.getElementById('compare-chart').layout.yaxis.title.text === 'samples_per_sec'"
    )
    assert "metric=samples_per_sec" in page.url


def test_the_sweep_page_shows_every_trial_the_best_and_a_line_per_succeeded_trial(
    page: Any, cluster: LocalCluster, jobs: Jobs
) -> None:
    assert cluster.tokens is not None
    body = {
        "name": f"sweep-{uuid.uuid4().hex[:8]}",
        # Trials long enough (300 steps, a few seconds) for the pruner to
        # hear one's reports and stop it: 60 steps ended before a node's
        # first report reached the server once the loop got faster.
        "spec": {"epochs": 2, "max_steps_per_epoch": 150, "batch_size": 64},
        "space": {
            "lr": {"type": "float", "low": 0.01, "high": 5, "log": True},
            "seed": {"type": "categorical", "choices": [1, 2]},
        },
        "objective": {"metric": "train_loss"},
        "max_trials": 6,
        "max_concurrent": 2,
        "sampler": {"kind": "random", "seed": 2},
        "pruner": {"kind": "asha", "reduction_factor": 2, "grace_steps": 10},
    }
    sweep_id = jobs.client.post("/sweeps", json=body).raise_for_status().json()["id"]
    page.goto(f"{cluster.url}/ui/sweeps")
    sign_in(page, cluster, cluster.tokens.user)
    page.locator(f"#sweeps a[href='/ui/sweeps/{sweep_id}']").click()
    page.wait_for_function(
        "document.querySelector('#status .badge')?.textContent === 'succeeded'",
        timeout=240_000,
    )
    api = jobs.client.get(f"/sweeps/{sweep_id}").json()
    page.wait_for_function(
        f"document.querySelectorAll('#sweep-trials tbody tr').length === {len(api['trials'])}"
    )
    # The trial table is GET /sweeps/{id}'s, row for row.
    rows = page.eval_on_selector_all(
        "#sweep-trials tbody tr",
        """rows => rows.map((r) => [Number(r.dataset.trial),
            Number(r.querySelector("a[href^='/ui/jobs/']").textContent),
            r.querySelector('.badge').textContent,
            r.querySelector('[data-value]').dataset.value])""",
    )
    assert rows == [
        [t["number"], t["job_id"], t["state"], "" if t["value"] is None else str(t["value"])]
        for t in api["trials"]
    ]
    succeeded = [t for t in api["trials"] if t["state"] == "succeeded"]
    assert succeeded and any(t["state"] == "pruned" for t in api["trials"])
    # The best trial is marked, and said.
    best = page.eval_on_selector_all(
        "#sweep-trials tr.best", "rows => rows.map((r) => r.dataset.trial)"
    )
    assert best == [str(api["best"]["number"])]
    assert f"Best: trial {api['best']['number']}" in page.inner_text("#sweep-best")
    # One line per succeeded trial: the parallel coordinates' every dimension
    # holds a value per succeeded trial, the objective last.
    page.wait_for_function(
        "document.getElementById('parcoords-chart').data?.[0]?.dimensions.length === 3"
    )
    dimensions = page.eval_on_selector(
        "#parcoords-chart", "c => c.data[0].dimensions.map((d) => [d.label, d.values.length])"
    )
    assert dimensions == [[label, len(succeeded)] for label in ("log10 lr", "seed", "train_loss")]
    objective = page.eval_on_selector("#parcoords-chart", "c => c.data[0].dimensions[2].values")
    assert objective == [t["value"] for t in succeeded]
    # The objective over steps: a line per trial that reported.
    lines = page.eval_on_selector("#objective-chart", "c => c.data.length")
    assert lines == sum(1 for t in api["trials"] if t["values"])
    page.screenshot(path=str(ARTIFACTS / "dashboard-sweep.png"), full_page=True)
    # A trial's job page says whose trial it is.
    page.click(f"#sweep-trials tr.best a[href='/ui/jobs/{api['best']['job_id']}']")
    page.locator(f"#sweep-of a[href='/ui/sweeps/{sweep_id}']").wait_for()
