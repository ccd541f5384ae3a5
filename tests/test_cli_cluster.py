"""Exactness on a cluster started from the command line: `dask scheduler` + 2 `dask worker`."""
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from test_pipeline import SPEC, check_aggregate, check_running_count, running_count

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def test_aggregate_and_stateful_map_on_cli_cluster(cli_cluster, zipf_path, zipf_frame):
    src = Stream.from_parquet(zipf_path, batch_size=20_000)
    src.key_by("key").aggregate(SPEC, parallelism=2, name="totals")
    outs = src.key_by("key").stateful_map(running_count, parallelism=2, name="running").sink_to_list()
    with streamlb.run(src, address=cli_cluster, n_workers=2) as job:
        job.wait(timeout=120)
        check_aggregate(job.state("totals"), zipf_frame)
        check_running_count(pd.concat(outs), job.state("running"), zipf_frame)
        workers = set(job.metrics().worker)
    assert len(workers) == 2
