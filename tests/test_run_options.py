"""``run()``'s arguments are checked once, into a frozen ``RunOptions``, before any cluster starts."""
import dataclasses
import time

import dask
import pytest
from streamz import Stream

import streamlb
from streamlb import CheckpointError, PipelineError
from streamlb._job import RunOptions


@pytest.mark.parametrize("kwargs, message", [
    ({"key_groups": 0}, r"run\(key_groups=0\): key-groups must be an integer in 1..1048576, got 0"),
    ({"batch_size": 0}, r"run\(batch_size=0\): batch_size must be an integer >= 1, got 0"),
    ({"batch_size": True}, r"run\(batch_size=True\): batch_size must be an integer >= 1"),
    ({"parallelism": -1}, r"run\(parallelism=-1\): parallelism must be an integer >= 1 or None"),
    ({"credits": 0}, r"run\(credits=0\): credits must be an integer >= 1"),
    ({"n_workers": 0}, r"run\(n_workers=0\): n_workers must be an integer >= 1 or None"),
    ({"window": "soon"}, r"run\(window='soon'\): window must be a duration > 0"),
    ({"window": 0}, r"run\(window=0\): window must be a duration > 0"),
    ({"balancer": "magic"}, r"run\(balancer='magic'\): unknown balancer 'magic'; valid balancers are .*static"),
    ({"migration": "warp"}, r"run\(migration='warp'\): unknown migration strategy 'warp'; valid strategies are "
                            "all-at-once, fluid, lazy, pause"),
    ({"autoscale": True, "scaler": "fancy"}, r"run\(scaler='fancy'\): unknown scaler 'fancy'; valid scalers are .*ds2"),
    ({"autoscale": True, "scaler_options": {"cooldown": -1}}, r"run\(scaler_options=.*\): ds2: cooldown must be"),
    ({"autoscale": 5}, r"autoscale must be True or \{operator: \(min, max\)\}, got 5"),
    ({"autoscale": {"a": "x"}}, r"autoscale\['a'\] must be \(min, max\)"),
    ({"autoscale": {"a": (3, 1)}}, r"autoscale\['a'\] = \(3, 1\): need 1 <= min <= max <= 1024"),
    ({"restart_attempts": -1}, r"run\(restart_attempts=-1\): restart_attempts must be an integer >= 0"),
    ({"state_backend": "rocks"}, r"run\(state_backend='rocks'\): unknown state backend 'rocks'; valid backends: "
                                 r"'memory', 'rocksdb'"),
])
def test_a_bad_argument_is_refused_by_name(kwargs, message):
    with pytest.raises(PipelineError, match=message):
        RunOptions.build(**kwargs)


def test_checkpoint_arguments(tmp_path):
    with pytest.raises(CheckpointError, match=r"run\(checkpoint_interval=0\): checkpoint_interval must be a duration"):
        RunOptions.build(checkpoint_interval=0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="not writable"):
        RunOptions.build(checkpoint=str(blocker / "ck"))
    with pytest.raises(CheckpointError, match="does not exist"):
        RunOptions.build(restore=str(tmp_path / "nowhere"))
    with dask.config.set({"streamlb.checkpoint.compression": "gzip"}):
        with pytest.raises(PipelineError, match="streamlb.checkpoint.compression is 'gzip'; valid values"):
            RunOptions.build(checkpoint=str(tmp_path / "ck"))


def test_a_bad_setting_is_named():
    with dask.config.set({"streamlb.state.backend": "disk"}):
        with pytest.raises(PipelineError, match=r"setting streamlb.state.backend: unknown state backend 'disk'"):
            RunOptions.build()
    with dask.config.set({"streamlb.key-groups": -3, "streamlb.channel.credits": 0}):
        with pytest.raises(PipelineError, match=r"setting streamlb.key-groups: .* got -3"):
            RunOptions.build()
        with pytest.raises(PipelineError, match=r"setting streamlb.channel.credits: credits must be"):
            RunOptions.build(key_groups=64)
    with dask.config.set({"streamlb.worker.heap-pad": "lots"}):
        with pytest.raises(PipelineError, match=r"setting streamlb.worker.heap-pad: must be a size in bytes .* "
                                                r"got 'lots'"):
            RunOptions.build()


def test_settings_fill_what_is_not_given_and_the_options_are_frozen():
    with dask.config.set({"streamlb.key-groups": 64, "streamlb.window": "250ms", "streamlb.checkpoint.interval": "2s"}):
        opts = RunOptions.build(batch_size=100, autoscale={"totals": [1, 3]})
    assert (opts.key_groups, opts.window, opts.checkpoint_interval) == (64, 0.25, 2.0)
    assert opts.batch_size == 100 and opts.batch_size_given
    assert opts.balancer == "static" and opts.autoscale == {"totals": (1, 3)} and opts.scaling is not None
    assert not RunOptions.build().batch_size_given
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.key_groups = 8


def test_run_refuses_before_it_connects():
    src = Stream.from_iterable([{"k": 1}])
    src.key_by("k").aggregate({"n": ("k", "count")}, name="totals").sink_to_list()
    t0 = time.time()
    with pytest.raises(PipelineError, match=r"run\(credits=0\)"):
        streamlb.run(src, address="tcp://127.0.0.1:9", credits=0)
    assert time.time() - t0 < 5
