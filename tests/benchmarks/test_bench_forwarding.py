"""benchmarks/perf/bench_forwarding.py: what forwarding each device's update costs against summing on the leaves."""


def test_forwarding_bytes_grow_with_updates_and_summing_does_not():
    from nvflare.app_common.decomposers import numpy_decomposers
    from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator

    from benchmarks.perf import bench_forwarding as bf

    numpy_decomposers.register()
    template = {"w": (64, 32), "b": (32,)}
    model_bytes = (64 * 32 + 32) * 4
    s1 = bf.measure(ModelUpdateDXOAggregator, template, 1, 1, 0)
    s4 = bf.measure(ModelUpdateDXOAggregator, template, 4, 1, 0)
    f4 = bf.measure(bf.ForwardingLeaf, template, 4, 1, 0)
    assert s1["payload_bytes"] == s4["payload_bytes"] == model_bytes
    assert f4["payload_bytes"] == 4 * model_bytes
    assert f4["bytes"] > 3.5 * s4["bytes"]
    table = bf.format_table([{"n": 4, "summing": s4, "forwarding": f4}])
    assert table.splitlines()[2].startswith("| 4 | ")
