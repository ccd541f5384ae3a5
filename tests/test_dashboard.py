"""The streamlb page of the Dask dashboard, opened in a real headless Chromium while a
balanced job runs on a real LocalCluster."""
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.plugin import NAME

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

# every text in the page, shadow roots included (bokeh 3 renders its models in them)
PAGE_TEXT = """
const texts = [];
const walk = (node) => {
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) {
        if (child.nodeType === Node.TEXT_NODE) texts.push(child.textContent);
        else walk(child);
    }
};
walk(document.body);
return texts.join(" ");
"""
CANVASES = """
let n = 0;
const walk = (node) => {
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.children || []) { if (child.tagName === "CANVAS") n += 1; walk(child); }
};
walk(document.body);
return n;
"""


@pytest.fixture(scope="module")
def cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as cl, \
            Client(cl) as c:
        yield c


@pytest.fixture
def skewed(tmp_path):
    """200k rows, Zipf(1.1) over 2000 keys: hashing leaves the instances uneven."""
    rng = np.random.default_rng(5)
    n = 200_000
    w = 1.0 / np.arange(1, 2001) ** 1.1
    df = pd.DataFrame({"key": rng.choice(2000, size=n, p=w / w.sum()).astype(np.int64),
                       "value": rng.random(n)})
    path = tmp_path / "skewed"
    path.mkdir()
    for p in range(2):
        df.iloc[p::2].to_parquet(path / f"part-{p}.parquet", index=False)
    return str(path)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url) as r:
        return json.load(r)


def test_page_is_listed_renders_the_job_live_and_goes_with_the_plugin(cluster, skewed, browser, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.by import By

    base = f"http://127.0.0.1:{cluster.scheduler_info()['services']['dashboard']}"
    assert not cluster.run_on_scheduler(lambda dask_scheduler: NAME in dask_scheduler.plugins)
    src = Stream.from_parquet(skewed, batch_size=1_000, rate=10_000)
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=3, name="per_key")
    # the job registers the balancer plugin on the running scheduler: the page comes at runtime
    with streamlb.run(src, client=cluster, key_groups=64, window="250ms", balancer="autoflow",
                      migration="fluid") as job:
        wait_for(lambda: len(job.balancer_state()["operators"]["per_key"]["imbalance"]) >= 4, 20,
                 "load windows of per_key")

        # listed where Dask lists its pages: the "More..." menu and individual-plots.json
        browser.get(base + "/status")
        menu = {a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, ".dropdown-content a")}
        assert base + "/streamlb" in menu
        assert get_json(base + "/individual-plots.json")["Individual Streamlb"] == "/individual-streamlb"

        browser.get(base + "/streamlb")
        wait_for(lambda: browser.execute_script("return document.readyState") == "complete", 10, "the page")
        wait_for(lambda: browser.execute_script(CANVASES) >= 4, 15, "the plots' canvases")
        text = wait_for(lambda: (t := browser.execute_script(PAGE_TEXT)) and "epoch" in t and t, 10,
                        "a refresh with the job's data")
        assert f"job {job.id}" in text and "operator per_key" in text
        assert "Status" in {a.text for a in browser.find_elements(By.CSS_SELECTOR, ".navbar a")}
        time.sleep(1.0)                 # a few more windows on the plots
        shot = tmp_path / "streamlb-dashboard.png"
        browser.save_screenshot(str(shot))
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors

    image = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
    colours, counts = np.unique(image, axis=0, return_counts=True)
    vivid = counts[(colours.max(axis=1) - colours.min(axis=1)) > 80]
    # the plots drew: the heat map's viridis and the instances' lines, not only grey text on white
    assert len(colours) > 50 and (vivid > 50).sum() >= 5 and vivid.sum() > 0.01 * len(image), \
        (len(colours), (vivid > 50).sum(), vivid.sum() / len(image))

    # the plugin closes (as at scheduler close; unregistering does not close it): the open
    # page says so, and the page leaves the dashboard and its menu
    async def close_plugin(dask_scheduler):
        await dask_scheduler.plugins[NAME].close()

    cluster.run_on_scheduler(close_plugin)
    cluster.unregister_scheduler_plugin(NAME)
    wait_for(lambda: "plugin has closed" in browser.execute_script(PAGE_TEXT), 10, "the open page to notice")
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(base + "/streamlb")
    assert "Individual Streamlb" not in get_json(base + "/individual-plots.json")
    browser.get(base + "/status")
    assert base + "/streamlb" not in {a.get_attribute("href")
                                      for a in browser.find_elements(By.CSS_SELECTOR, ".dropdown-content a")}


def test_page_lists_the_registrys_jobs_and_jobs_json_is_read_only(browser, tmp_path):
    """With a job registry on the scheduler, the page opens with its jobs (name, status,
    uptime, parallelism, records/s, last checkpoint, restarts), and ``/streamlb/jobs.json``
    serves the same records to GET only."""
    from distributed import Client, LocalCluster

    from streamlb.plugin import BalancerPlugin, JobRegistry

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    rng = np.random.default_rng(1)
    pd.DataFrame({"key": rng.integers(0, 50, 2_000), "value": rng.random(2_000)}).to_parquet(
        inp / "part-0.parquet", index=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as cl, \
            Client(cl) as client:
        client.register_plugin(BalancerPlugin())
        client.register_plugin(JobRegistry(str(tmp_path / "jobs")))
        base = f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}"
        src = Stream.from_parquet(str(inp), watch="500ms")
        src.key_by("key").aggregate({"n": ("value", "count")}, name="totals", parallelism=2).to_parquet(str(out))
        job = streamlb.submit(src, client=client, name="dash-counts", checkpoint=str(tmp_path / "ck"),
                              checkpoint_interval="500ms")
        try:
            wait_for(lambda: (job.describe()["info"].get("checkpoint") or {}).get("id"), 30, "a checkpoint")
            browser.get(base + "/streamlb")
            wait_for(lambda: browser.execute_script("return document.readyState") == "complete", 10, "the page")
            text = wait_for(lambda: (t := browser.execute_script(PAGE_TEXT)) and "dash-counts" in t
                            and "ago" in t and t, 15, "the registry's jobs on the page")
            assert "jobs of the cluster's job registry" in text
            for column in ("status", "uptime", "parallelism", "records/s", "last checkpoint", "restarts"):
                assert column in text, column
            assert "running" in text and "totals=2" in text and f"dash-counts ({job.id})" in text

            listed = get_json(base + "/streamlb/jobs.json")["jobs"]
            assert [(r["name"], r["status"], r["id"]) for r in listed] == [("dash-counts", "running", job.id)]
            assert listed[0]["info"]["parallelism"] == {"from_parquet(in)": 2, "totals": 2}
            for method in ("POST", "PUT", "DELETE"):     # read-only: nothing on HTTP changes a job
                req = urllib.request.Request(base + "/streamlb/jobs.json", data=b"{}", method=method)
                with pytest.raises(urllib.error.HTTPError, match="405"):
                    urllib.request.urlopen(req)
            assert job.status == "running"

            # the page refreshes in place: a later refresh shows the job's uptime moved on
            first = text[text.index("dash-counts"):]
            wait_for(lambda: (t := browser.execute_script(PAGE_TEXT)) and "dash-counts" in t
                     and t[t.index("dash-counts"):] != first, 15, "a refresh of the registry's jobs")
            errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, errors
        finally:
            if job.status in ("starting", "running", "restarting"):
                job.cancel()
            job.close()
